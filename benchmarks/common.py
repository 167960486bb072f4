"""Shared helpers for benchmarks: timing, machine description, JSON output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parse_args(doc: str, argv: list[str] | None, threads: int, **integers: int) -> argparse.Namespace:
    """The options most benchmarks share: ``--NAME N`` for each integer default given, ``--threads``
    (applied to torch here) and ``--out FILE`` (the JSON result)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in integers.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def wall_times_ms(fn, repeats: int, warmup: int) -> list[float]:
    """The wall times of ``repeats`` calls of ``fn()`` in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def time_call(fn, repeats: int, warmup: int = 2) -> dict:
    """Median and min wall time of ``fn()`` in milliseconds after ``warmup`` untimed calls."""
    samples = wall_times_ms(fn, repeats, warmup)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "repeats": repeats}


def percentiles(fn, repeats: int, warmup: int = 5) -> dict:
    """p50, p95 and min wall time of ``fn()`` in milliseconds after ``warmup`` untimed calls."""
    samples = sorted(wall_times_ms(fn, repeats, warmup))
    return {"p50_ms": round(statistics.median(samples), 4), "p95_ms": round(samples[int(0.95 * (repeats - 1))], 4),
            "min_ms": round(samples[0], 4), "repeats": repeats}


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cuda": torch.cuda.is_available(),
    }


def write_json(name: str, payload: dict, out: str | None = None) -> Path:
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, sort_keys=True)
    path.write_text(text + "\n")
    print(text)
    return path


def write_result(path: str, result: dict) -> None:
    """``result`` as indented JSON to ``path`` (its folder made) and to standard output."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
