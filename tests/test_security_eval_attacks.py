"""Watermark stealing, spoofing and scrubbing: the estimator, the spoofer's bias, the CLI's refusals.

The estimator runs on a synthetic stream whose colours are known: a random base model over a small
vocabulary, watermarked by +delta on the green tokens of each one-token context (lefthash, h = 1).
Bounds are binomial tails: an estimator that knew nothing would call a unit green independently of its
colour, so the units it calls green would be green at the prior rate gamma.
"""

import numpy as np
import pytest
import torch
from scipy.stats import binom

from api.cli import main
from evaluation.spoofing import SCORE_CAP, SpoofMark, scrub_edit, spoof_edit
from evaluation.stealing import ColourEstimate, StolenCounts, accumulate, colour_accuracy

V, GAMMA, DELTA = 40, 0.25, 2.0
TAIL = 1e-9  # one-sided tail of the no-information binomial a test may fall in


def _stream(tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.full(V, 0.5), size=V)  # p_base(t | c)
    green = rng.random((V, V)) < GAMMA  # the key's colours of (c, t)
    marked = base * np.exp(DELTA * green)
    marked /= marked.sum(axis=1, keepdims=True)
    ids = [int(rng.integers(V))]
    for _ in range(tokens):
        ids.append(int(rng.choice(V, p=marked[ids[-1]])))
    ids = np.array(ids)
    # row i: the base model's whole distribution of token i given the token before it (row 0: no context)
    top_ids = np.tile(np.arange(V), (len(ids), 1))
    top_probs = np.vstack([np.full(V, 1.0 / V), base[ids[:-1]]])
    return ids, top_ids, top_probs, green


def test_stolen_colours_beat_the_prior_by_a_binomial_bound():
    ids, top_ids, top_probs, green = _stream(20_000)
    estimate = ColourEstimate(accumulate([(list(ids), top_ids, top_probs)], V, window=1, self_anchor=False))
    units = np.array([[c, t] for c in range(V) for t in range(V)])
    truth = green[units[:, 0], units[:, 1]]
    scores, known = estimate.unit_scores(units)
    believed = known & (scores > 0)
    called, right = int(believed.sum()), int((believed & truth).sum())
    assert called > 0 and right > binom.isf(TAIL, called, GAMMA)  # green calls: far above the prior gamma
    red_called = known & (scores <= 0)
    assert int((red_called & ~truth).sum()) > binom.isf(TAIL, int(red_called.sum()), 1 - GAMMA)
    report = colour_accuracy(estimate, units, truth)
    assert report["units"] == V * V and 0 < report["coverage"] <= 1


def test_more_stolen_tokens_cover_more_units():
    ids, top_ids, top_probs, _ = _stream(20_000, seed=1)
    few = ColourEstimate(accumulate([(list(ids[:500]), top_ids[:500], top_probs[:500])], V, 1, False))
    many = ColourEstimate(accumulate([(list(ids), top_ids, top_probs)], V, 1, False))
    assert len(many.keys) > len(few.keys)
    assert many.counts.tokens == len(ids) - 1 and few.counts.tokens == 499


def test_a_context_token_repeated_in_the_window_is_one_pair():
    ids = [3, 3, 7]  # 7 after the window (3, 3): the pair (3, 7) once, not twice
    rows = np.zeros((3, 1), dtype=np.int64) + 7, np.ones((3, 1))
    counts = accumulate([(ids, *rows)], 10, window=2, self_anchor=True)
    key = 3 * 10 + 7
    assert counts.pair_seen[counts.pair_keys == key].tolist() == [1.0]
    assert counts.token_seen[7] == 1 and counts.tokens == 1


def test_counts_survive_a_save_and_load(tmp_path):
    ids, top_ids, top_probs, _ = _stream(300, seed=2)
    counts = accumulate([(list(ids), top_ids, top_probs)], V, 1, False)
    counts.save(tmp_path / "c.npz")
    again = StolenCounts.load(tmp_path / "c.npz")
    assert again.tokens == counts.tokens and again.window == 1 and again.self_anchor is False
    assert np.array_equal(again.pair_keys, counts.pair_keys) and np.allclose(again.pair_expected, counts.pair_expected)


def _toy_estimate() -> ColourEstimate:
    # after context 1: token 2 seen 5 times where the base model expected 0.5 (green), token 3 never where
    # it expected 5 (red)
    keys = np.array([1 * 6 + 2, 1 * 6 + 3], dtype=np.int64)
    counts = StolenCounts(6, 1, False, keys, np.array([5.0, 0.0]), np.array([0.5, 5.0]), np.zeros(6), np.zeros(6), 5)
    return ColourEstimate(counts)


def test_the_spoofer_boosts_only_tokens_it_believes_green():
    mark = SpoofMark(_toy_estimate(), delta=3.0, label="toy")
    scores = torch.zeros(2, 6)
    mark.pipeline_stage.transform_(scores, [[1], [4]], [mark, mark])
    assert scores[0, 2] == pytest.approx(3.0)  # log(5.5 / 1.0) > SCORE_CAP: the full delta
    assert SCORE_CAP <= np.log(5.5)
    assert scores[0].nonzero().flatten().tolist() == [2]  # believed red (token 3): no bias
    assert not scores[1].any()  # a context it knows nothing about: untouched


def test_the_engine_can_describe_the_spoofers_outputs():
    """The engine describes every output's watermark by its public fields (``watermark_info``), once per spec;
    the spoofer's mark is a stand-in whose spec is not hashable, and must go through the same path (it once
    raised TypeError there, which stopped ``provmark eval security --attack spoofing``)."""
    from generation.sequence import request_output

    mark = SpoofMark(_toy_estimate(), delta=3.0, label="toy")
    out = request_output("r", [1], [2, 3], "text", "length", mark)
    assert out.watermark.spec == "spoof:toy,delta=3" and out.watermark.fingerprint == mark.fingerprint
    assert out.watermark.key_id is None


def test_edits_move_colours_the_way_each_attack_wants():
    import random

    estimate = _toy_estimate()
    logits = torch.zeros(1, 6)
    logits[0, 2], logits[0, 3], logits[0, 5] = 3.0, 2.0, 1.0  # the base model's candidates after token 1
    assert spoof_edit(estimate, [1, 3], logits, [1], 0.5, random.Random(0)) == [1, 2]  # red -> green
    assert scrub_edit(estimate, [1, 2], logits, [1], 0.5, random.Random(0)) == [1, 3]  # green -> red
    assert scrub_edit(estimate, [1, 2], logits, [1], 0.0, random.Random(0)) == [1, 2]  # no budget, no edit


@pytest.mark.parametrize("flags, needle", [
    (["--attack", "stealin"], "--attack"),
    (["--attack", "stealing", "--steal-tokens", "10"], "--steal-tokens"),
    (["--attack", "stealing", "--steal-tokens", "1e4,x"], "--steal-tokens"),
    (["--attack", "scrubbing", "--rates", "0.1,1.5"], "--rates"),
    (["--attack", "spoofing", "--schemes",
      "hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0,hashing_key=15485863,context_width=1"], "--schemes"),
    (["--attack", "spoofing", "--eval-texts", "500"], "--eval-texts"),
    (["--attack", "all", "--spoof-delta", "0"], "--spoof-delta"),
    (["--attack", "stealing", "--estimator", "known-units", "--schemes", "kgw:scheme=lefthash,h=5,gamma=0.25,delta=2.0"],
     "--estimator"),
])
def test_bad_options_are_a_clear_cli_error(tmp_path, capsys, flags, needle):
    assert main(["eval", "security", *flags, "--out", str(tmp_path / "x")]) != 0
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything ran


def test_attack_names_select_what_runs():
    from evaluation.security_attacks import ATTACKS
    from evaluation.security_cli import wanted_attacks

    assert wanted_attacks("oracle") == (True, ())
    assert wanted_attacks("all") == (True, ATTACKS)
    assert wanted_attacks("scrubbing, stealing") == (False, ("stealing", "scrubbing"))  # run in dependency order
    with pytest.raises(ValueError, match="known"):
        wanted_attacks("oracle,steal")


def test_bad_oracle_options_are_refused_with_all_too(tmp_path, capsys):
    assert main(["eval", "security", "--attack", "all", "--units", "1", "--out", str(tmp_path / "x")]) != 0
    assert "--units" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_the_base_model_pass_holds_one_chunk_of_logits_at_a_time():
    # 1e5 stolen tokens held [1e5, V] float logits at once (20 GB with the embedded model's V): the run
    # was killed at 15 GB and climbing. The pass now takes BASE_CHUNK sequences per call, same figures.
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from evaluation import stealing
    from evaluation.lm import TeacherForcedLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()

    class Counting(TeacherForcedLM):
        calls: list[int] = []

        def next_token_logits(self, sequences, positions):
            self.calls.append(len(sequences))
            return super().next_token_logits(sequences, positions)

    lm = Counting(SimpleNamespace(model=model, vocab=SimpleNamespace(tokenizer=None)))
    rng = np.random.default_rng(0)
    sequences = [rng.integers(64, size=int(rng.integers(3, 12))).tolist() for _ in range(2 * stealing.BASE_CHUNK + 5)]
    starts = [1 + i % 2 for i in range(len(sequences))]
    got = stealing.base_topk(lm, sequences, starts, top_k=8)
    assert max(lm.calls) <= stealing.BASE_CHUNK and sum(lm.calls) == len(sequences)
    whole = lm.next_token_logits(sequences, [list(range(s, len(q))) for q, s in zip(sequences, starts)])
    for (ids, probs), rows, seq, start in zip(got, whole, sequences, starts):
        p = torch.softmax(rows.double(), dim=-1)
        assert ids.shape == (len(seq) - start, 9)
        assert np.array_equal(ids[:, :8], torch.topk(p, 8, dim=-1).indices.numpy())
        assert np.allclose(probs[:, :8], torch.topk(p, 8, dim=-1).values.numpy())


SELFHASH = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0"


def _selfhash_stream(mark, tokens: int, seed: int):
    """A stream watermarked by ``mark`` (selfhash h = 4): a first-order random base model, +DELTA on the
    green candidates of each step's real 4-token context (the candidate takes part in its own seed)."""
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.full(V, 0.5), size=V)
    ids = [int(t) for t in rng.integers(V, size=4)]
    for _ in range(tokens):
        green = mark.green_mask(torch.tensor([ids[-4:]]))[0].numpy()
        p = base[ids[-1]] * np.exp(DELTA * green)
        ids.append(int(rng.choice(V, p=p / p.sum())))
    ids = np.array(ids)
    top_ids = np.tile(np.arange(V), (len(ids), 1))
    top_probs = np.vstack([np.full(V, 1.0 / V), base[ids[:-1]]])
    return ids, top_ids, top_probs


def test_selfhash_anchors_can_be_learned_from_the_stolen_text():
    """The pair vote (``ColourEstimate``) spreads each position over every context token. A thief who learns
    which context token anchors (``LearnedAnchors``: leading bits of each token's keyed value, from the same
    pair counts and the public salts) names the unit itself, and one told by the key (``known-units``) is the
    bound. On one stolen selfhash stream: the learned thief's green calls beat the prior by a binomial bound,
    and it is right about more held-out units than the vote and fewer than the bound."""
    from evaluation.stealing import KnownUnitEstimate, LearnedAnchors, accumulate_units
    from watermark.scheme import make_watermark
    from watermark.seeding import selfhash_salts

    mark = make_watermark(SELFHASH, bytes(range(32)), V)
    stolen = [tuple(_selfhash_stream(mark, 20_000, seed=3))]
    pair_counts = accumulate(stolen, V, window=4, self_anchor=True)
    learned = LearnedAnchors(pair_counts, selfhash_salts(V))
    estimates = {"vote": ColourEstimate(pair_counts),
                 "learned": KnownUnitEstimate(accumulate_units(stolen, learned), learned),
                 "bound": KnownUnitEstimate(accumulate_units(stolen, mark), mark)}
    held, _, _ = _selfhash_stream(mark, 3_000, seed=4)
    units, truth = mark.ngrams(held.tolist()).numpy(), mark.green_flags(held.tolist()).numpy()
    scores, seen = estimates["learned"].unit_scores(units)
    called = seen & (scores > 0)
    assert int((called & truth).sum()) > binom.isf(TAIL, int(called.sum()), GAMMA)
    # the spoofer's generations are cached by the table's digest: who named the units is part of it
    assert estimates["learned"].digest_material() != estimates["bound"].digest_material()
    accuracy = {name: colour_accuracy(e, units, truth)["balanced_accuracy_all"] for name, e in estimates.items()}
    assert accuracy["vote"] < accuracy["learned"] < accuracy["bound"], accuracy
    assert estimates["bound"].counts.tokens == 20_000 and learned.known.max() > 0


def test_the_known_unit_tables_row_is_its_units(tmp_path):
    """What the spoofer adds after a context (``row_scores``) is the score of the unit each candidate would
    form there (``unit_scores``), for every candidate; and the counts survive a save and load."""
    from evaluation.stealing import KnownUnitEstimate, UnitCounts, accumulate_units
    from watermark.scheme import make_watermark

    mark = make_watermark(SELFHASH, bytes(range(32)), V)
    counts = accumulate_units([tuple(_selfhash_stream(mark, 2_000, seed=5))], mark)
    estimate = KnownUnitEstimate(counts, mark)
    for context in ([1, 2, 3, 4], [7, 7, 9, 0], [5, 6, 5, 6, 11, 12, 13, 14]):
        row, row_known = estimate.row_scores(context)
        cand = np.array([context[-4:] + [t] for t in range(V)])
        each, each_known = estimate.unit_scores(cand)
        assert np.array_equal(row, each) and np.array_equal(row_known, each_known) and row_known.any()
    counts.save(tmp_path / "u.npz")
    again = UnitCounts.load(tmp_path / "u.npz")
    assert again.tokens == counts.tokens and np.array_equal(again.units, counts.units)
    assert np.allclose(again.expected, counts.expected)


def test_the_base_models_rows_survive_a_save_and_load(tmp_path):
    """The base-model pass is the costly half of stealing; its rows are kept so the other estimator's run
    reads them instead of a second pass."""
    from evaluation.stealing import load_rows, save_rows

    rows = [tuple(_stream(n, seed=n)[:3]) for n in (5, 1, 12)]
    rows = [(list(ids), top_ids, top_probs) for ids, top_ids, top_probs in rows]
    save_rows(tmp_path / "rows.npz", rows)
    again = load_rows(tmp_path / "rows.npz")
    assert len(again) == 3 and not list(tmp_path.glob("*.tmp*"))
    for (ids, top_ids, top_probs), (ids2, top_ids2, top_probs2) in zip(rows, again):
        assert ids == ids2 and np.array_equal(top_ids, top_ids2) and np.array_equal(top_probs, top_probs2)


def test_held_out_prompts_reach_past_the_first_corpus():
    """``--eval-texts`` was capped at 49 (what the 299 articles leave after the 250 training prompts): a
    spoof rate below 5 % needs 59 texts with none detected. Lee's 50 test articles follow them, disjoint
    from every training prompt."""
    from evaluation.corpus import held_out_documents, prompt_documents
    from evaluation.security_attacks import TRAIN_PROMPTS, AttackConfig

    held = held_out_documents(TRAIN_PROMPTS)
    train = {d.first_sentence for d in prompt_documents(TRAIN_PROMPTS)}
    assert len(held) >= 80 and not train & {d.first_sentence for d in held}
    assert len({d.index for d in held}) == len(held)
    assert held[:10] == prompt_documents(TRAIN_PROMPTS + 10)[TRAIN_PROMPTS:]  # older runs' prompts first
    AttackConfig(eval_texts=80, estimator="known-units")
    with pytest.raises(ValueError, match="estimator"):
        AttackConfig(estimator="anchors")
    with pytest.raises(ValueError, match="minhash"):
        AttackConfig(estimator="learned-anchors", schemes=("kgw:scheme=minhash,h=4,gamma=0.25,delta=2.0",))
    with pytest.raises(ValueError, match="h = 4"):  # a longer n-gram has no key-free name to count it under
        AttackConfig(estimator="known-units", schemes=("kgw:scheme=lefthash,h=5,gamma=0.25,delta=2.0",))
    AttackConfig(estimator="known-units", schemes=("kgw:scheme=lefthash,h=4,gamma=0.25,delta=2.0",))


def _script(name: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "research" / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_level_trade_script_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert _script("spoof_level_trade").main(["--run", str(tmp_path)]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_the_match_script_refuses_a_folder_without_generations_and_bad_rates(tmp_path, capsys):
    script = _script("own_output_match")
    assert script.main(["--run", str(tmp_path)]) == 2
    assert "no cache/generations.jsonl" in capsys.readouterr().err
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "generations.jsonl").write_text("")
    assert script.main(["--run", str(tmp_path), "--edits", "0.2,1.5"]) == 2
    assert "bad option" in capsys.readouterr().err


def test_the_thieves_figure_reads_runs_and_refuses_what_is_not_one(tmp_path, capsys):
    import json

    script = _script("compare_thieves")
    run = tmp_path / "run"
    run.mkdir()
    section = {"spoofing": {"generated": {"success_rate": 0.9}, "spoof_check": {"success_with_spoof_check": 0.4}}}
    (run / "results.json").write_text(json.dumps({"config": {}, "lab": {"300000": section, "100000": section,
                                                                        "control": {}}}))
    assert script.points(json.loads((run / "results.json").read_text()), "lab") == [(100000, 0.9, 0.4), (300000, 0.9, 0.4)]
    out = tmp_path / "fig.png"
    assert script.main(["--run", f"bound={run}", "--label", "lab", "--out", str(out)]) == 0 and out.stat().st_size > 0
    assert script.main(["--run", f"bound={tmp_path / 'none'}", "--label", "lab", "--out", str(out)]) == 2
    assert script.main(["--run", f"bound={run}", "--label", "other", "--out", str(out)]) == 2
    assert "no spoofing results" in capsys.readouterr().err
