"""CUDA graphs for decode batches: one captured decode step per (rows, table width) bucket, replayed.

A decode step of a small model is mostly kernel launches (30 layers x a dozen kernels, each a few
microseconds of GPU work); a CUDA graph replays the whole step as one launch. A graph has fixed shapes and
fixed addresses, so each bucket owns static buffers: token ids ``[R]``, positions ``[R]`` and block tables
``[R, W]``, R a batch bucket (BATCH_BUCKETS) and W a table-width bucket (powers of two up to a full
sequence's blocks). A real batch of n rows whose longest row spans w blocks is copied into the smallest
bucket with R >= n and W >= w; the padding rows hold token 0 at position 0 with every table entry the
runner's scratch block (a block the block manager never hands out), so they write there and their logits
are dropped; the padding table entries of real rows also name the scratch block, and the row lengths
(position + 1) mask every key beyond a row's own. Batches larger than the largest bucket run eagerly.

The step itself is the runner's own decode forward (``ModelRunner.decode_forward``) over the static
buffers, with the block-table attention (paged_attention.py): on CUDA it is captured on first use of a
bucket (after two warm-up runs on a side stream; all graphs share one memory pool) and replayed after;
elsewhere (``capture=False``) the same static-shape step runs eagerly, which is how the padding and
bucketing are tested on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
WARMUP_RUNS = 2  # eager runs on a side stream before a capture (lazy initialisations happen outside the graph)


def bucket_for(value: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket >= value; None when value exceeds them all."""
    return next((b for b in buckets if b >= value), None)


def width_buckets(blocks_per_seq: int) -> tuple[int, ...]:
    """Table widths captured: powers of two below a full sequence's blocks, then the full width."""
    widths, w = [], 1
    while w < blocks_per_seq:
        widths.append(w)
        w *= 2
    return (*widths, blocks_per_seq)


def padded_inputs(positions: list[int], tables: list[list[int]], rows: int, width: int,
                  scratch: int) -> tuple[list[int], list[list[int]]]:
    """Positions and block tables of a batch padded to ``rows`` x ``width``: each real row's table cut to
    ``width`` entries and filled with ``scratch``; padding rows at position 0 with tables all ``scratch``."""
    if len(positions) > rows or len(tables) != len(positions):
        raise ValueError(f"padded_inputs: {len(positions)} rows / {len(tables)} tables into a {rows}-row bucket")
    padded_tables = [t[:width] + [scratch] * (width - len(t[:width])) for t in tables]
    padding = rows - len(positions)
    return list(positions) + [0] * padding, padded_tables + [[scratch] * width] * padding


@dataclass(slots=True)
class StaticBatch:
    """One bucket's buffers (fixed addresses), its logits buffer and its graph (None: run eagerly)."""

    token_ids: torch.Tensor  # int64 [R]
    meta: torch.Tensor  # int64 [R, 1 + W]: column 0 the positions, then the block tables
    logits: torch.Tensor | None = None  # float32 [R, V], written by each replay
    graph: torch.cuda.CUDAGraph | None = None

    @property
    def positions(self) -> torch.Tensor:
        return self.meta[:, 0]

    @property
    def tables(self) -> torch.Tensor:
        return self.meta[:, 1:]


class DecodeGraphs:
    """Decode steps through static buckets: captured CUDA graphs (``capture``) or the same static step eagerly.

    ``runner``: the ModelRunner (block-table attention on, ``decode_forward``); ``scratch_block``: a pool
    block no sequence ever owns."""

    def __init__(self, runner, scratch_block: int, capture: bool,
                 batch_buckets: tuple[int, ...] = BATCH_BUCKETS) -> None:
        if capture and runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {runner.device}")
        self.runner = runner
        self.scratch = scratch_block
        self.capture = capture
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.width_buckets = width_buckets(runner.cache.config.blocks_per_seq)
        self.block_size = runner.block_size
        self.batches: dict[tuple[int, int], StaticBatch] = {}
        self.pool = None  # the graphs' shared memory pool (after the first capture)
        self.replays = 0  # decode steps served from a bucket (tests and benchmarks read it)

    def bucket(self, rows: int, kv_len: int) -> tuple[int, int] | None:
        """(rows, width) bucket of a batch of ``rows`` whose longest row holds ``kv_len`` keys; None: too big."""
        width = bucket_for(-(-kv_len // self.block_size), self.width_buckets)
        batch = bucket_for(rows, self.batch_buckets)
        return None if width is None or batch is None else (batch, width)

    def decode(self, token_ids: torch.Tensor, positions: list[int], tables: list[list[int]],
               logit_rows: list[int] | None = None) -> torch.Tensor | None:
        """ModelRunner.decode through a bucket: logits [n, V] (of ``logit_rows`` when given); None when the
        batch fits no bucket (the caller runs it eagerly)."""
        rows = len(positions)
        key = self.bucket(rows, max(positions) + 1)
        if key is None:
            return None
        static = self.batches.get(key) or self._make(*key)
        padded_positions, padded_tables = padded_inputs(positions, tables, *key, self.scratch)
        meta = torch.tensor([[p, *t] for p, t in zip(padded_positions, padded_tables)], dtype=torch.long)
        static.meta.copy_(meta, non_blocking=False)
        static.token_ids[:rows].copy_(token_ids)
        static.token_ids[rows:].zero_()
        if static.graph is not None:
            static.graph.replay()
            logits = static.logits
        else:
            logits = self._forward(static)
        self.replays += 1
        if logit_rows is not None:
            return logits[torch.tensor(logit_rows, dtype=torch.long, device=logits.device)]
        return logits[:rows].clone()  # the buffer is overwritten by the next replay

    def _forward(self, static: StaticBatch) -> torch.Tensor:
        kv_len = static.tables.shape[1] * self.block_size
        return self.runner.decode_forward(static.token_ids, static.positions, static.tables, kv_len)

    def _make(self, rows: int, width: int) -> StaticBatch:
        device = self.runner.device
        static = StaticBatch(torch.zeros(rows, dtype=torch.long, device=device),
                             torch.full((rows, 1 + width), self.scratch, dtype=torch.long, device=device))
        static.meta[:, 0] = 0  # padding rows: position 0 of the scratch block
        if self.capture:
            self._capture(static)
        self.batches[(rows, width)] = static
        return static

    @torch.inference_mode()
    def _capture(self, static: StaticBatch) -> None:
        """Warm up on a side stream, then capture the step into a graph writing ``static.logits``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._forward(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):  # other threads may use CUDA
            static.logits = self._forward(static)
        self.pool = graph.pool()
        static.graph = graph
