"""CTranslate2 on engine_throughput.py's greedy workload: the same weights, prompts and forced 128 new tokens.

    bash scripts/setup_ct2_venv.sh          # once: .venv-ct2 (ctranslate2, torch and transformers for its converter)
    python benchmarks/ctranslate2_throughput.py [--batches 1,16,64] [--runs 3] [--compute-type float32] [--threads 2]

Run from provmark's .venv: it makes the prompts (engine_throughput.make_prompts, 10..200 tokens; one
32-token prompt at batch 1) and finds the embedded model's folder, then runs this same file in .venv-ct2
(``--child``), which converts that folder once with CTranslate2's Transformers converter (cached under
``~/.cache/provmark/ct2/``) and times ``Generator.generate_batch`` over each batch: greedy
(``sampling_topk=1``), ``min_length`` = ``max_length`` = 128 new tokens, the prompt left out of the result,
``--threads`` intra-op threads, one replica. Tokens/s are generated tokens over wall time, the median of
``--runs`` after one warm-up; ``tokens_per_request`` shows the count really generated.

Writes benchmarks/results/ctranslate2_throughput.json and prints it. ``run_in_ct2_venv()`` returns the
child's JSON to another script (engine_throughput.py's ``--ctranslate2`` column).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv-ct2" / "bin" / "python"
CACHE = Path.home() / ".cache" / "provmark" / "ct2"
NEW_TOKENS = 128
CHILD_TIMEOUT_S = 3600


def child(job_path: str) -> int:
    """In .venv-ct2: convert (once) and time each batch; the JSON on stdout's last line."""
    import ctranslate2  # noqa: PLC0415 (only .venv-ct2 has it)

    job = json.loads(Path(job_path).read_text())
    model_dir, compute = Path(job["model_dir"]), job["compute_type"]
    out_dir = CACHE / f"{model_dir.name}-{compute}-{ctranslate2.__version__}"
    if not (out_dir / "model.bin").exists():
        from ctranslate2.converters import TransformersConverter  # noqa: PLC0415 (pulls torch, transformers)

        quantization = None if compute == "float32" else compute
        TransformersConverter(str(model_dir)).convert(str(out_dir), quantization=quantization, force=True)
    generator = ctranslate2.Generator(str(out_dir), device="cpu", compute_type=compute, inter_threads=1,
                                      intra_threads=job["threads"])
    vocab = json.loads((out_dir / "vocabulary.json").read_text())
    results = {}
    for key, prompts in job["batches"].items():
        tokens = [[vocab[i] for i in p] for p in prompts]

        def run(batch=tokens):
            start = time.perf_counter()
            outs = generator.generate_batch(batch, max_batch_size=len(batch), sampling_topk=1,
                                            max_length=NEW_TOKENS, min_length=NEW_TOKENS,
                                            include_prompt_in_result=False)
            elapsed = time.perf_counter() - start
            made = [len(o.sequences_ids[0]) for o in outs]
            return sum(made) / elapsed, made

        run()  # warm-up
        rates, made = [], []
        for _ in range(job["runs"]):
            rate, made = run()
            rates.append(rate)
        results[key] = {"tokens_per_s": round(statistics.median(rates), 2), "runs": [round(r, 2) for r in rates],
                        "tokens_per_request": sorted(set(made))}
    print(json.dumps({"ctranslate2": ctranslate2.__version__, "compute_type": compute, "threads": job["threads"],
                      "results": results}))
    return 0


def run_in_ct2_venv(batches: list[int], runs: int, compute_type: str, threads: int) -> dict:
    """This file's child in .venv-ct2 over engine_throughput's prompts; its JSON. RuntimeError if the venv is
    missing or the child fails."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_throughput import make_prompts  # noqa: PLC0415 (torch and the engine: only the parent needs them)

    from generation.models import ensure_default_model  # noqa: PLC0415 (as above)
    from watermark.vocab import load_vocabulary  # noqa: PLC0415 (as above)

    if not VENV_PYTHON.exists():
        raise RuntimeError(f"{VENV_PYTHON} is missing: run `bash scripts/setup_ct2_venv.sh` first")
    vocab_size = load_vocabulary(None).vocab_size
    job = {"model_dir": str(ensure_default_model()), "compute_type": compute_type, "threads": threads, "runs": runs,
           "batches": {f"batch{b}_greedy": make_prompts(b, vocab_size) for b in batches}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(job, handle)
    try:
        done = subprocess.run([str(VENV_PYTHON), __file__, "--child", handle.name], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, env={**os.environ, "PYTHONPATH": ""})
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        raise RuntimeError(f"ctranslate2 child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes (1, 16, 64)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--compute-type", default="float32", help="float32, int8, int8_float32, bfloat16 ...")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "ctranslate2_throughput.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    try:
        report = run_in_ct2_venv([int(b) for b in args.batches.split(",")], args.runs, args.compute_type, args.threads)
    except RuntimeError as exc:
        print(f"ctranslate2_throughput: {exc}", file=sys.stderr)
        return 1
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
