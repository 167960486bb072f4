"""The vLLM plugin with a stopwatch, for benchmarks/vllm_throughput.py: the seconds vLLM's worker spends in
the plugin (``update_state`` + ``apply``), read back with ``LLM.collective_rpc(read_and_reset)``. That
share of a run's time is the plugin's own cost, steadier than a throughput ratio on a shared machine."""

from __future__ import annotations

import time

from generation.vllm.plugin import ProvmarkWatermarkLogitsProcessor

TIMED_PLUGIN = "benchmarks.vllm_plugin_timer:TimedPlugin"
_spent = [0.0]  # seconds in the plugin since the last read, this worker process


class TimedPlugin(ProvmarkWatermarkLogitsProcessor):
    def update_state(self, batch_update) -> None:
        start = time.perf_counter()
        super().update_state(batch_update)
        _spent[0] += time.perf_counter() - start

    def apply(self, logits):
        start = time.perf_counter()
        out = super().apply(logits)
        _spent[0] += time.perf_counter() - start
        return out


def read_and_reset(worker=None) -> float:
    """Seconds spent in the plugin since the last call (``collective_rpc`` passes the worker)."""
    spent, _spent[0] = _spent[0], 0.0
    return spent
