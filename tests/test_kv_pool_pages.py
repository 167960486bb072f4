"""The KV pools take memory page by page as blocks are written, in plain 4 KiB pages.

numpy's zeros (the pools' former allocator) ask the kernel for transparent huge pages on large arrays; where
THP is enabled for such requests (``madvise``, the common default), the first write into each 2 MiB page made
the kernel compact memory to find one, for every layer's pools at once: 100-250 ms stalls in the middle of
decoding (benchmarks/engine_workloads.py's arrival workload, p99 time between tokens 150 ms against 47 ms).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from generation.kv_cache import lazy_zeros

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux's /proc/self/smaps")


def _mapping_kib(address: int) -> dict[str, int]:
    """Rss and AnonHugePages (KiB) of the mapping that holds ``address``."""
    fields, inside = {}, False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head in ("Rss:", "AnonHugePages:"):
            fields[head[:-1]] = int(line.split()[1])
    return fields


def test_pool_pages_are_backed_only_once_written_and_never_huge():
    pool = lazy_zeros((64, 3, 16, 64, 64), torch.float32, torch.device("cpu"))  # 48 MiB
    assert pool.shape == (64, 3, 16, 64, 64) and pool.dtype == torch.float32
    assert float(pool[10, 1].abs().sum()) == 0.0  # zeros (reading maps the shared zero page)
    pool[40, 2, 3].fill_(1.5)  # 16 KiB written
    fields = _mapping_kib(pool.data_ptr())
    assert fields["AnonHugePages"] == 0
    assert fields["Rss"] < 1024  # a few 4 KiB pages, not the 48 MiB pool nor a 2 MiB huge page
    assert float(pool.sum()) == 1.5 * 64 * 64


def test_bf16_and_empty_pools():
    pool = lazy_zeros((4, 2, 16, 8), torch.bfloat16, torch.device("cpu"))
    assert pool.dtype == torch.bfloat16 and float(pool.float().abs().sum()) == 0.0
    assert lazy_zeros((0, 2, 16, 8), torch.float32, torch.device("cpu")).numel() == 0
