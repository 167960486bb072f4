"""A burst of requests: 64 prompts arriving together are prefilled in one step, and prompts admitted behind
running decodes get chunks that grow with the decodes (half of them past ``max_step_tokens``), so a late
prompt starts in a few dozen steps, not hundreds; a single arrival beside 16 decodes keeps its 8 tokens."""

from __future__ import annotations

from generation.block_manager import BlockManager
from generation.sample.sampler import SamplingParams
from generation.scheduler import MIN_CHUNK_TOKENS, Scheduler, SchedulerConfig, chunk_budget
from generation.sequence import Sequence, TextTracker


def make_seq(n: int, rid: str, first: int) -> Sequence:
    params = SamplingParams(max_new_tokens=128, temperature=0.0)
    state = type("State", (), {"history": list(range(first, first + n))})()
    return Sequence(rid, list(range(first, first + n)), params, state, TextTracker(None, None))


def test_the_chunk_beside_decodes_is_what_they_leave_or_half_of_them():
    assert chunk_budget(16, 24) == MIN_CHUNK_TOKENS == 8  # the single-arrival case the 1.5x bound is measured on
    assert chunk_budget(2, 24) == 22
    assert chunk_budget(40, 24) == 20 and chunk_budget(64, 24) == 32


def test_sixty_four_prompts_of_105_tokens_arriving_together_are_prefilled_in_one_step():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=64, max_model_len=256), BlockManager(num_blocks=64 * 16,
                                                                                            block_size=16))
    for i in range(64):
        scheduler.add(make_seq(105, f"r{i}", first=1000 * i))  # distinct prompts: nothing to share
    batch = scheduler.schedule()
    assert sum(map(len, batch.prefill_groups)) == 64 and not scheduler.waiting


def test_prompts_admitted_behind_forty_decodes_get_chunks_of_twenty():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=64, max_model_len=256), BlockManager(num_blocks=64 * 16,
                                                                                            block_size=16))
    early = [make_seq(10, f"e{i}", first=1000 * i) for i in range(40)]
    for seq in early:
        scheduler.add(seq)
    scheduler.schedule()
    for seq in early:  # prefilled, first token sampled: decoding
        seq.num_cached = seq.num_tokens
        seq.output_ids.append(0)
    scheduler.add(make_seq(105, "late", first=99_000))
    batch = scheduler.schedule()
    assert len(batch.decode) == 40 and [n for _, n in batch.chunks] == [20]
