"""vLLM (CPU build) throughput without and with provmark's watermark plugin. Runs in .venv-vllm:

    bash scripts/setup_vllm_venv.sh
    .venv-vllm/bin/python benchmarks/vllm_throughput.py [--runs 3] [--dtype float32] [--batches 1,16]
        [--modes greedy,sampled] [--engines plain,plugin] [--eager] [--no-tuned]

Workload: engine_throughput.py's (its make_prompts: the same prompts, 10..200 tokens, 128 new tokens
forced, greedy and sampled). Two engines, each in its own child process (vLLM keeps one engine per
process well; start-up takes minutes): ``plain`` (no plugin) and ``plugin`` (every request
watermarked with the default spec and a throwaway key; also timed with every request opted out, the
plugin's floor). The plugin's cost is reported against both, the in-process opted-out figure being
the steadier one (its runs interleave with the watermarked ones). Child processes get the "tuned"
LD_PRELOAD (tcmalloc + the venv's libiomp5) when both libraries are found.

Writes benchmarks/results/vllm_throughput.json and prints it. ``run_in_vllm_venv()`` runs this
script from any interpreter (e.g. .venv's engine_throughput.py) and returns the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from generation.models import ensure_default_model
from generation.vllm.rows import RequestWatermarks, WatermarkedBatch
from watermark.keys import Keyring

ROOT = Path(__file__).resolve().parent.parent
RESULT_PATH = ROOT / "benchmarks" / "results" / "vllm_throughput.json"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SETUP_SCRIPT = "scripts/setup_vllm_venv.sh"
PLUGIN = "generation.vllm.plugin:ProvmarkWatermarkLogitsProcessor"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4
# FACTS.md, "vLLM on this CPU": a bounded KV cache, no core held back for the front end
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1"}
MAX_MODEL_LEN = 512  # the longest prompt (200) + 128 new tokens, like engine_throughput.py
CHILD_TIMEOUT_S = 3600


def run_in_vllm_venv(args: list[str] | None = None, timeout: float = 2 * CHILD_TIMEOUT_S) -> dict:
    """Run this benchmark in .venv-vllm and return its JSON report (also written to its --output).

    Callable from any interpreter: nothing here imports vLLM. Raises FileNotFoundError when the venv
    is missing (create it with scripts/setup_vllm_venv.sh), RuntimeError when the run fails."""
    if not VLLM_PYTHON.exists():
        raise FileNotFoundError(f"{VLLM_PYTHON} not found: run `bash {SETUP_SCRIPT}` first")
    args = list(args or [])
    with tempfile.TemporaryDirectory() as tmp:
        if "--output" not in args:
            args += ["--output", str(Path(tmp) / "vllm_throughput.json")]
        output = Path(args[args.index("--output") + 1])
        done = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).resolve()), *args], cwd=ROOT, check=False,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"vllm_throughput.py failed ({done.returncode}): {done.stderr[-3000:]}")
        return json.loads(output.read_text())


def tuned_preload() -> str | None:
    """LD_PRELOAD for vLLM's tuned CPU figures, or None when a library is missing."""
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if TCMALLOC.exists() and iomp.exists():
        return f"{TCMALLOC}:{iomp}"
    return None


# ---- child: one engine in this process --------------------------------------------------------
def _sampling(sampled: bool, seed: int, extra_args: dict | None):
    from vllm import SamplingParams

    from benchmarks.engine_throughput import NEW_TOKENS, SAMPLED

    settings = SAMPLED if sampled else {"temperature": 0.0}
    return SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, ignore_eos=True, seed=seed,
                          extra_args=extra_args, **settings)


def _timed_generate(llm, prompts, sampled: bool, extra_args: dict | None) -> float:
    """Tokens per second of one batch: every prompt submitted at once."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    params = [_sampling(sampled, seed, extra_args) for seed in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def run_child(engine: str, dtype: str, batches: list[int], modes: list[str], runs: int, eager: bool) -> dict:
    """Figures of one engine ('plain' or 'plugin') built in this process."""
    import secrets

    from vllm import LLM

    from benchmarks.engine_throughput import make_prompts, median_of
    if engine == "plugin":  # a throwaway keyring: the user's is never touched
        home = Path(tempfile.mkdtemp(prefix="provmark-vllm-bench-"))
        os.environ["PROVMARK_HOME"] = str(home)
        os.environ.pop("PROVMARK_MASTER_KEY", None)
        Keyring(home).create(f"bench-{secrets.token_hex(2)}")
    start = time.perf_counter()
    llm = LLM(str(ensure_default_model()), dtype=dtype, max_model_len=MAX_MODEL_LEN, seed=0,
              enforce_eager=eager, logits_processors=[PLUGIN] if engine == "plugin" else None)
    startup_s = time.perf_counter() - start
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    results = {}
    for batch in batches:
        prompts = make_prompts(batch, vocab_size)
        for mode in modes:
            sampled = mode == "sampled"
            if engine == "plain":
                fns = {"plain": lambda p=prompts, s=sampled: _timed_generate(llm, p, s, None)}
            else:
                fns = {"watermarked": lambda p=prompts, s=sampled: _timed_generate(llm, p, s, None),
                       "opted_out": lambda p=prompts, s=sampled: _timed_generate(
                           llm, p, s, {"provmark_watermark": "off"})}
            results[f"batch{batch}_{mode}"] = median_of(fns, runs)
            print(f"{engine} batch {batch} {mode}: {json.dumps(results[f'batch{batch}_{mode}'])}",
                  file=sys.stderr, flush=True)
    return {"startup_s": round(startup_s, 1), "results": results}


# ---- parent: both engines, one child process each --------------------------------------------
def _child_process(engine: str, args) -> dict:
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in VLLM_ENV.items()}}
    preload = tuned_preload() if args.tuned else None
    if preload:
        env["LD_PRELOAD"] = preload
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--child-output", out.name,
               "--dtype", args.dtype, "--batches", args.batches, "--modes", args.modes, "--runs", str(args.runs)]
        if args.eager:
            cmd.append("--eager")
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=CHILD_TIMEOUT_S)
        return {**json.loads(Path(out.name).read_text()), "ld_preload": preload}


def apply_cost_ms(batch: int, steps: int = 50) -> dict:
    """The plugin's own work per decoding step (its ``apply`` on [batch, V] logits, default spec),
    outside vLLM: the part of the cost that does not depend on the machine's other load as much."""
    import secrets

    import torch

    from benchmarks.engine_throughput import make_prompts
    vocab_size = 49152  # SmolLM2's logits width
    keyring = Keyring(Path(tempfile.mkdtemp(prefix="provmark-vllm-bench-")),
                      master_key=secrets.token_bytes(32))
    keyring.create("bench")
    rows = WatermarkedBatch(RequestWatermarks(vocab_size, keyring))
    prompts = make_prompts(batch, vocab_size)
    outputs: list[list[int]] = [[] for _ in prompts]
    rows.update([], [(i, None, p, outputs[i]) for i, p in enumerate(prompts)], [])
    logits = torch.randn(batch, vocab_size, generator=torch.Generator().manual_seed(0))
    samples = []
    for step in range(steps + 3):  # 3 warm-up steps
        for i, out in enumerate(outputs):
            out.append(prompts[i][(step * 7) % len(prompts[i])])  # the engine appends one token per step
        work = logits.clone()
        start = time.perf_counter()
        rows.apply(work)
        if step >= 3:
            samples.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": round(statistics.median(samples), 3), "min_ms": round(min(samples), 3), "steps": steps}


def _cost(watermarked: float, baseline: float) -> float:
    return round(1 - watermarked / baseline, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--dtype", default="float32", help="model dtype: float32 or bfloat16")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes (1 and/or 16)")
    parser.add_argument("--modes", default="greedy,sampled", help="comma-separated: greedy and/or sampled")
    parser.add_argument("--engines", default="plain,plugin", help="which engines to run")
    parser.add_argument("--eager", action="store_true", help="enforce_eager: skip vLLM's compile warm-up")
    parser.add_argument("--no-tuned", dest="tuned", action="store_false", help="no tcmalloc/libiomp5 LD_PRELOAD")
    parser.add_argument("--output", type=Path, default=RESULT_PATH)
    parser.add_argument("--child", choices=("plain", "plugin"), help=argparse.SUPPRESS)
    parser.add_argument("--child-output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    batches = [int(b) for b in args.batches.split(",")]
    if not set(batches) <= {1, 16}:
        parser.error("--batches: choose from 1,16")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= {"greedy", "sampled"}:
        parser.error("--modes: choose from greedy,sampled")
    sys.path.insert(0, str(ROOT))
    if args.child:
        figures = run_child(args.child, args.dtype, batches, modes, args.runs, args.eager)
        args.child_output.write_text(json.dumps(figures))
        return 0

    engines = [e for e in args.engines.split(",") if e]
    if not engines or not set(engines) <= {"plain", "plugin"}:
        parser.error("--engines: choose from plain,plugin")
    children = {engine: _child_process(engine, args) for engine in engines}
    results: dict[str, dict] = {}
    for key in (children.get("plugin") or children["plain"])["results"]:
        entry: dict = {}
        for child in children.values():
            entry.update(child["results"][key])
        if "watermarked" in entry:
            marked = entry["watermarked"]["tokens_per_s"]
            entry["plugin_cost_vs_opted_out"] = _cost(marked, entry["opted_out"]["tokens_per_s"])
            if "plain" in entry:
                entry["plugin_cost_vs_plain"] = _cost(marked, entry["plain"]["tokens_per_s"])
        results[key] = entry
    apply_ms = {f"batch{batch}": apply_cost_ms(batch) for batch in batches}

    from importlib.metadata import version

    from benchmarks.engine_throughput import NEW_TOKENS, PROMPT_LENGTHS, SAMPLED

    report = {
        "benchmark": "vllm_throughput",
        "command": ".venv-vllm/bin/python benchmarks/vllm_throughput.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "vllm": version("vllm-cpu"),
        "dtype": args.dtype,
        "enforce_eager": args.eager,
        "new_tokens": NEW_TOKENS,
        "prompt_lengths": list(PROMPT_LENGTHS),
        "sampled_settings": SAMPLED,
        "watermark_spec": "default (kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256)",
        "runs": args.runs,
        "engines": {name: {k: v for k, v in child.items() if k != "results"} for name, child in children.items()},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "results": results,
        "plugin_apply_ms": apply_ms,
        "note": "medians after a warm-up; plain and plugin ran one after the other in separate processes, "
                "so plugin_cost_vs_opted_out (interleaved runs in one engine) is the steadier figure",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
