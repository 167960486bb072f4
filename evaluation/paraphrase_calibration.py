"""The false-match rate of ``paraphrase_of_own_output``, fitted on one half of the texts, checked on the other.

    python -m evaluation.paraphrase_calibration --outputs DIR/cache/generations.jsonl[,...] [--write] [--out FILE]

Negatives of two kinds, each split in two: human text (``detector.human_corpora``: each fit or held-out document
cut into passages of PASSAGE_WORDS words, at most PER_DOC per document, first 200 tokens) and outputs of the same
model (the generations an evaluation run cached: ``provmark eval robustness`` writes them, split by a hash of the
prompt). Pairs of an output with an output of the same prompt are not unrelated and are left out.

Fit: per pair (one negative text, one remembered output), how many pairs reach each similarity of the grid
(``detector.paraphrase_match.ParaphraseNull``), and the threshold: the lowest grid point at which at most
TARGET_RATE of the fit human passages (against the memory, every output) and at most TARGET_RATE of the fit
outputs (against the unrelated ones) are falsely matched, each text by its highest words similarity to any of
them, as a verdict decides (``evaluation.paraphrase_words``). Check: the held-out texts' false matches at that
threshold against the same memory, and the held-out per-text rate that ``ParaphraseNull.false_match_rate``
promises for it. ``--write`` first fits the word stems' document frequencies on the fit half (human passages and
outputs: ``db.passage_words.fit_stems``, ``db/data/word_stems.npz``), which weigh every signature, and stores the
fit in ``detector/data/paraphrase_null.json``: what both services ship.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

from db.passage_words import STEMS_FILE, fit_stems, stems
from detector.human_corpora import FIT, HELD_OUT, documents
from detector.normalize import normalize
from detector.paraphrase_match import NULL_FILE, ParaphraseNull
from evaluation.paraphrase_words import best_of, signatures, word_similarities
from watermark.vocab import encode, load_vocabulary

QUOTE_WORDS = 8  # a shared run this long: the prompt quotes the text
WORDS = re.compile(r"\w+")
PASSAGE_WORDS = 150  # about 200 tokens of prose, the outputs' length
PER_DOC = 16  # passages of one document at most (a long source file does not outweigh the rest)
TOKENS = 200
GRID = np.round(np.arange(0.0, 1.0 + 1e-9, 0.0025), 4)
TARGET_RATE = 1e-4  # the per-text false-match rate the threshold is set for, on each null's fit half


def passages(split: str) -> tuple[list[str], list[str]]:
    """(passages, their domains) of one half of the human corpora."""
    texts, domains, _ = passages_of_documents(split)
    return texts, domains


def passages_of_documents(split: str) -> tuple[list[str], list[str], list[int]]:
    """(passages, their domains, their documents' numbers) of one half of the human corpora."""
    texts, domains, numbers = [], [], []
    for number, doc in enumerate(documents(split=split)):
        words = doc.text.split()
        for start in range(0, min(len(words), PASSAGE_WORDS * PER_DOC), PASSAGE_WORDS):
            chunk = words[start:start + PASSAGE_WORDS]
            if len(chunk) >= PASSAGE_WORDS // 2:
                texts.append(" ".join(chunk))
                domains.append(doc.domain)
                numbers.append(number)
    return texts, domains, numbers


def read_outputs(paths: list[str]) -> list[dict]:
    """Every cached generation of the given JSONL files: text and prompt (duplicates dropped)."""
    seen, out = set(), []
    for path in paths:
        # split on newlines only: a text may hold other line separators (U+2028, U+0085) that splitlines() cuts at
        for line in Path(path).read_text().split("\n"):
            if not line.strip():
                continue
            try:
                value = json.loads(line)["value"]
            except json.JSONDecodeError:
                continue  # a torn last line of an interrupted run (evaluation.cache recomputes it)
            if value["text"] in seen or not value["text"].strip():
                continue
            seen.add(value["text"])
            prompt = hashlib.sha256(json.dumps(value["prompt_ids"]).encode()).hexdigest()
            out.append({"text": value["text"], "prompt": prompt, "prompt_ids": value["prompt_ids"]})
    return out


def quoted_pairs(vocab, texts: list[str], numbers: list[int], outputs: list[dict]) -> np.ndarray:
    """[len(texts), len(outputs)] bool: the output's prompt quotes the text's document (a passage of it shares a
    run of QUOTE_WORDS words with the prompt; ``numbers``: each text's document). Such a pair is not unrelated
    (an evaluation prompts with a document's first sentence, and the output repeats or continues it): left out
    of the human null, as pairs of outputs of one prompt are of the outputs null."""
    by_prompt: dict[str, list[int]] = {}
    for column, output in enumerate(outputs):
        by_prompt.setdefault(output["prompt"], []).append(column)
    runs: dict[tuple, set[str]] = {}
    for prompt, columns in by_prompt.items():
        for run in _runs(vocab.tokenizer.decode(outputs[columns[0]]["prompt_ids"], skip_special_tokens=True)):
            runs.setdefault(run, set()).add(prompt)
    quoting: dict[int, set[str]] = {}  # document number -> the prompts that quote one of its passages
    for text, number in zip(texts, numbers):
        quoting.setdefault(number, set()).update(*(runs.get(run, set()) for run in _runs(text)))
    quoted = np.zeros((len(texts), len(outputs)), dtype=bool)
    for row, number in enumerate(numbers):
        for prompt in quoting[number]:
            quoted[row, by_prompt[prompt]] = True
    return quoted


def _runs(text: str) -> set[tuple]:
    words = WORDS.findall(text.lower())
    return {tuple(words[i:i + QUOTE_WORDS]) for i in range(len(words) - QUOTE_WORDS + 1)}


def token_ids(vocab, texts: list[str]) -> list[list[int]]:
    """Each text's first TOKENS token ids as the services read it (normalised)."""
    return [encode(vocab, normalize(t).text)[:TOKENS] for t in texts]


def refit_stems(vocab, texts: list[str], outputs: list[str], path: Path) -> None:
    """The word stems' document frequencies (``db.passage_words.fit_stems``) on ``texts`` (human) and ``outputs``
    (the model's), each read as the services read it (its first TOKENS tokens)."""
    ids = [i for i in token_ids(vocab, texts) + token_ids(vocab, outputs) if len(i)]
    decoded = vocab.tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    fit_stems([stems(text) for text in decoded], path)


def exceedances(pairs: np.ndarray) -> list[int]:
    """Per grid point, the pairs at or above it."""
    ordered = np.sort(pairs.ravel())
    return (ordered.shape[0] - np.searchsorted(ordered, GRID - 1e-7, side="left")).tolist()


def calibrate(vocab, outputs: list[dict], progress=print, stems_file: Path | None = None) -> dict:
    """The fit (``ParaphraseNull``'s dict) and the held-out check, as one JSON-safe dict. ``stems_file``: fit the
    stems' frequencies on the fit half first and write them there (None: use the shipped ones).

    What is fitted is the words similarity a verdict decides on (``evaluation.paraphrase_words``): per pair, the
    signatures' cosine (the nulls' exceedances, every pair); per text, the highest of them (the threshold and the
    held-out check)."""
    prompts = np.array([o["prompt"] for o in outputs])
    fit_out = np.array([int(p[:2], 16) % 2 == 0 for p in prompts])
    if stems_file is not None:
        refit_stems(vocab, passages(FIT)[0], [o["text"] for o, fit in zip(outputs, fit_out) if fit], stems_file)
    texts = [o["text"] for o in outputs]
    memory_words = signatures(vocab, token_ids(vocab, texts))
    related = prompts[:, None] == prompts[None, :]  # pairs of outputs of one prompt
    output_words = word_similarities(memory_words, memory_words)
    output_words[related] = -1.0
    output_best = best_of(output_words)[0]
    halves = {}
    for split in (FIT, HELD_OUT):
        texts, domains, numbers = passages_of_documents(split)
        progress(f"{split}: {len(texts)} human passages")
        quoted = quoted_pairs(vocab, texts, numbers, outputs)
        progress(f"{split}: {int(quoted.sum())} pairs of a passage and an output whose prompt quotes it left out")
        words = word_similarities(signatures(vocab, token_ids(vocab, texts)), memory_words)
        words[quoted] = -1.0
        halves[split] = {"words": words if split == FIT else None, "domains": np.array(domains), "quoted": quoted,
                         "best": best_of(words)[0]}
    human, quoted = halves[FIT]["words"], halves[FIT]["quoted"]
    unrelated_fit = ~related[fit_out]
    nulls = {
        "human": {"pairs": int((~quoted).sum()), "texts": int(human.shape[0]), "outputs": len(outputs),
                  "exceed": exceedances(human[~quoted])},
        "outputs": {"pairs": int(unrelated_fit.sum()), "texts": int(fit_out.sum()), "outputs": len(outputs),
                    "exceed": exceedances(output_words[fit_out][unrelated_fit])},
    }
    # matched says "not a human text, not another output": at the threshold, at most a fraction TARGET_RATE of the fit
    # human passages, and of the fit outputs against their best unrelated output, are falsely matched (with 10^4 texts
    # of each, one); the rates at a similarity are reported beside it (other_output_rate)
    fit_human, fit_outputs = halves[FIT]["best"], output_best[fit_out]
    highest = max(float(fit_human.max()), float(fit_outputs.max()))
    threshold = max(rate_threshold(fit_human), rate_threshold(fit_outputs))
    fit = {"grid": GRID.tolist(), "nulls": nulls, "threshold": threshold,
           "source": "python -m evaluation.paraphrase_calibration"}
    null = ParaphraseNull.from_dict(fit)
    held_human = halves[HELD_OUT]["best"]
    held_outputs = output_best[~fit_out]
    check = {
        "threshold": threshold, "fit_highest": highest, "fit_human_highest": float(fit_human.max()),
        "fit_outputs_highest": float(fit_outputs.max()), "memory_outputs": len(outputs),
        "held_out_human": _check(held_human, threshold, null, len(outputs)),
        "held_out_outputs": _check(held_outputs, threshold, null, len(outputs), ("outputs",)),
        "held_out_human_by_domain": {
            d: _check(held_human[halves[HELD_OUT]["domains"] == d], threshold, null, len(outputs))
            for d in sorted(set(halves[HELD_OUT]["domains"].tolist()))},
    }
    return {"fit": fit, "check": check}


def rate_threshold(best: np.ndarray, rate: float = TARGET_RATE) -> float:
    """The lowest grid point at which at most ``rate`` of the texts (each by its ``best`` similarity) reach it."""
    allowed = int(np.floor(rate * best.shape[0] + 1e-9))
    ordered = np.sort(best)[::-1]
    above = float(ordered[allowed]) if allowed < ordered.shape[0] else -1.0  # the first text not allowed through
    return float(GRID[min(len(GRID) - 1, int(np.searchsorted(GRID, above, side="right")))])


def _check(best: np.ndarray, threshold: float, null: ParaphraseNull, searched: int,
           names: tuple[str, ...] = ("human",)) -> dict:
    """Texts, false matches at ``threshold``, their rate, the rate the fit's nulls ``names`` promise there,
    quantiles of the best similarity per text."""
    false = int((best >= threshold).sum())
    return {"texts": int(best.shape[0]), "false_matches": false,
            "rate": false / best.shape[0] if best.shape[0] else None,
            "promised_rate": null.false_match_rate(threshold, searched, names),
            "best_similarity": {q: float(np.quantile(best, float(q))) for q in ("0.5", "0.99", "0.999", "1")}
            if best.shape[0] else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.paraphrase_calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", required=True, help="generations.jsonl files of evaluation runs, comma-separated")
    parser.add_argument("--write", action="store_true",
                        help=f"fit the stems' frequencies again ({STEMS_FILE}) and store the fit in {NULL_FILE}")
    parser.add_argument("--out", help="write the fit and the check here (JSON)")
    args = parser.parse_args(argv)
    paths = [p for p in args.outputs.split(",") if p]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"paraphrase_calibration: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    outputs = read_outputs(paths)
    if len(outputs) < 4:
        print(f"paraphrase_calibration: {len(outputs)} outputs; at least 4 needed", file=sys.stderr)
        return 2
    result = calibrate(load_vocabulary(), outputs, stems_file=STEMS_FILE if args.write else None)
    print(json.dumps(result["check"], indent=1))
    if args.write:
        NULL_FILE.write_text(json.dumps(result["fit"], separators=(",", ":")) + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
