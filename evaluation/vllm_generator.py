"""The evaluation's generations through vLLM with our watermark plugin, instead of our engine.

``VLLMGenerator`` answers the one call ``GenerationSource`` makes of an engine,
``generate(prompts, params, watermarks=..., use_tqdm=False)``, so the robustness evaluation measures
text exactly as a vLLM fleet running ``generation.vllm.plugin`` would produce it. Each request
carries its watermark as the plugin's ``extra_args`` (spec string and key id; ``"off"`` for the
unwatermarked set), so green lists come from the same keyring.

vLLM lives in its own venv (``scripts/setup_vllm_venv.sh``). Where ``vllm`` imports (running inside
``.venv-vllm``), the generator runs it in this process; otherwise it runs this module in
``.venv-vllm``'s interpreter with the requests in a temporary JSON file, once per call (the
evaluation asks for all its rows in one call: ``config.max_num_seqs`` is unbounded). The child finds
the keyring through ``PROVMARK_HOME`` (and ``PROVMARK_MASTER_KEY`` when the keyring was opened with an
explicit master key); no secret is written to the request file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from generation.models import DEFAULT_MODEL_ALIASES, ensure_default_model
from watermark.keyring_seal import format_master_key

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# vLLM on a small CPU: a bounded KV cache (GiB), no core held back for its front end (vLLM's CPU installation guide)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1"}
ALL_ROWS = 1 << 30  # GenerationSource batches by config.max_num_seqs: one call for everything


@dataclass(slots=True)
class _Config:
    max_num_seqs: int = ALL_ROWS


@dataclass(slots=True)
class VLLMOutput:
    token_ids: list[int]
    text: str
    finish_reason: str


def request_rows(prompts, params, watermarks) -> list[dict]:
    """Plain JSON rows for the child: prompt ids, sampling settings, the plugin's extra_args."""
    rows = []
    for prompt, p, wm in zip(prompts, params, watermarks):
        extra = {"provmark_watermark": "off"} if wm is None else {"provmark_watermark": wm.spec.format()}
        if wm is not None and wm.key_id is not None:
            extra["provmark_key_id"] = wm.key_id
        rows.append({"prompt_ids": list(prompt), "max_tokens": p.max_new_tokens, "min_tokens": p.min_new_tokens,
                     "temperature": p.temperature, "seed": p.seed, "extra_args": extra})
    return rows


def run_rows(llm, rows: list[dict]) -> list[dict]:
    """Generate every row with an ``LLM`` built with the plugin; token ids, text, finish reason."""
    from vllm import SamplingParams, TokensPrompt  # noqa: PLC0415 (vllm is installed only in .venv-vllm)

    params = [SamplingParams(max_tokens=r["max_tokens"], min_tokens=r["min_tokens"], temperature=r["temperature"],
                             seed=r["seed"], extra_args=r["extra_args"]) for r in rows]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in rows], params, use_tqdm=False)
    return [{"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
             "finish_reason": o.outputs[0].finish_reason or "length"} for o in outputs]


def make_llm(model_dir: str):
    """vLLM's engine over ``model_dir`` with the provmark plugin (fp32, eager: no compile warm-up)."""
    from vllm import LLM  # noqa: PLC0415 (vllm is installed only in .venv-vllm)

    from generation.vllm.plugin import PLUGIN_FQCN  # noqa: PLC0415 (it imports vllm, installed only in .venv-vllm)

    for name, value in VLLM_ENV.items():
        os.environ.setdefault(name, value)
    return LLM(model_dir, logits_processors=[PLUGIN_FQCN], dtype="float32", seed=0, enforce_eager=True)


class VLLMGenerator:
    """``generate(prompts, params, watermarks, use_tqdm)`` through vLLM (see the module docstring)."""

    def __init__(self, keyring, model_dir: str | Path | None = None, llm=None) -> None:
        if model_dir is None or str(model_dir).strip().lower() in DEFAULT_MODEL_ALIASES:
            model_dir = ensure_default_model()
        self.model_dir = str(model_dir)
        self.keyring = keyring
        self.config = _Config()
        self._llm = llm

    def generate(self, prompts, params, watermarks=None, use_tqdm: bool = False) -> list[VLLMOutput]:
        watermarks = list(watermarks) if watermarks is not None else [None] * len(prompts)
        rows = request_rows(prompts, params, watermarks)
        if self._llm is None and _vllm_importable():
            self._llm = make_llm(self.model_dir)
        results = run_rows(self._llm, rows) if self._llm is not None else self._run_child(rows)
        return [VLLMOutput(**r) for r in results]

    def _run_child(self, rows: list[dict]) -> list[dict]:
        if not VLLM_PYTHON.exists():
            raise FileNotFoundError(f"{VLLM_PYTHON} not found: run `bash scripts/setup_vllm_venv.sh` first")
        env = {**os.environ, **{k: os.environ.get(k, v) for k, v in VLLM_ENV.items()},
               "PROVMARK_HOME": str(self.keyring.home)}
        master = getattr(self.keyring, "_given_master_key", None)
        if master is not None:
            env["PROVMARK_MASTER_KEY"] = format_master_key(master)
        with tempfile.TemporaryDirectory() as tmp:
            request, answer = Path(tmp) / "rows.json", Path(tmp) / "out.json"
            request.write_text(json.dumps({"model_dir": self.model_dir, "rows": rows}))
            done = subprocess.run([str(VLLM_PYTHON), "-m", "evaluation.vllm_generator", str(request), str(answer)],
                                  cwd=ROOT, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"vLLM generation failed (exit {done.returncode}): {done.stderr[-2000:]}")
            return json.loads(answer.read_text())


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _child(request_path: str, answer_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    results = run_rows(make_llm(request["model_dir"]), request["rows"])
    Path(answer_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:3]))
