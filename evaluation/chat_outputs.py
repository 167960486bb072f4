"""Outputs of the model on varied chat requests, and how many of their paraphrases ``paraphrase_of_own_output``
recognises.

    python -m evaluation.chat_outputs generate --n 6000 --out DIR/chat.jsonl
    python -m evaluation.chat_outputs recall --outputs DIR/chat.jsonl[,MORE.jsonl] --texts 300 --out DIR/recall.json

``generate``: ``--n`` requests a user might send (one of REQUESTS, about one to three topic words drawn from
the tokenizer's whole-word tokens by a seeded generator), answered by the embedded model through the engine
with the default spec under a fresh key at temperature 1, exactly ``--tokens`` tokens each, written as JSON lines
in the form ``evaluation.paraphrase_calibration --outputs`` reads (resumable: requests already written are
skipped). The evaluation's news prompts all continue one corpus; these are the other outputs of the same model
the calibration needs in numbers (each request has its own prompt, so none is left out as related).

``recall``: the first ``--texts`` outputs of the held-out half (by the calibration's split of prompts) of the
first file, rewritten two ways by the embedded model: sentence by sentence (the ``paraphrase`` attack at rate 1)
and whole, in one request (REWRITE); each rewrite is looked up against a memory of every output of every file as
a verdict looks it up (``evaluation.paraphrase_words``), and counts as recognised when the output it names is its
source, at or above the shipped threshold (``detector/data/paraphrase_null.json``). The rewrites are cached beside ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

from detector.paraphrase_match import NULL_FILE, ParaphraseNull
from evaluation.attack_context import AttackContext
from evaluation.attacks_model import PARAPHRASE_TEMPERATURE, paraphrase
from evaluation.paraphrase_calibration import read_outputs, token_ids
from evaluation.paraphrase_words import best_of, signatures, word_similarities
from evaluation.runner import chat_prompt_ids
from generation.engine import Engine
from generation.models import load_model
from generation.sample.sampler import SamplingParams
from watermark.config import WatermarkSpec
from watermark.keys import Keyring
from watermark.scheme import generation_watermark
from watermark.vocab import load_vocabulary

REQUESTS = (
    "Write a short news report about {a} and {b}.", "Tell me a story involving {a}, {b} and {c}.",
    "Explain how {a} relates to {b}.", "Write an email to a colleague about {a}.",
    "Give me some tips about {a} and {b}.", "Write a blog post on {a}.", "Describe {a} to a child.",
    "What are the pros and cons of {a}?", "Write a product review of a {a}.", "Summarise the history of {a}.",
    "Write a poem about {a} and {b}.", "Write Python code that deals with {a}.",
    "Answer: why is {a} important for {b}?")
REWRITE = "Rewrite the following text in your own words. Keep what it says, change the wording.\n\n{text}"
TOPIC_WORD = re.compile(r"[a-z]{5,12}")
SEED = 20261129
BATCH = 64


def requests(tokenizer, n: int) -> list[str]:
    """The first ``n`` requests of the seeded sequence (the same on every machine for one tokenizer)."""
    words = sorted({token[1:] for token in tokenizer.get_vocab()
                    if token.startswith("\u0120") and TOPIC_WORD.fullmatch(token[1:])})
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(n):
        a, b, c = rng.choice(words, 3, replace=False)
        out.append(REQUESTS[int(rng.integers(len(REQUESTS)))].format(a=a, b=b, c=c))
    return out


def generate(n: int, out: Path, tokens: int, home: Path | None, dtype: str | None = None) -> int:
    loaded = load_model(dtype=dtype)
    tokenizer = loaded.vocab.tokenizer
    done = {json.loads(line)["key"] for line in _lines(out)}
    todo = [(f"u{i}", text) for i, text in enumerate(requests(tokenizer, n)) if f"u{i}" not in done]
    print(f"{len(done)} written, {len(todo)} to generate", file=sys.stderr)
    if not todo:
        return 0
    keyring = Keyring(home) if home is not None else Keyring()
    mark = generation_watermark(WatermarkSpec.default(), loaded.vocab.vocab_size, keyring=keyring,
                                create_if_missing=True)
    prompts = [chat_prompt_ids(tokenizer, text) for _, text in todo]
    engine = Engine(loaded, max_num_seqs=BATCH, max_model_len=max(map(len, prompts)) + tokens + 8)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as file:
        for start in range(0, len(todo), BATCH):
            rows = range(start, min(start + BATCH, len(todo)))
            params = [SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0,
                                     seed=_seed(todo[i][0])) for i in rows]
            for i, output in zip(rows, engine.generate([prompts[i] for i in rows], params, watermarks=mark,
                                                       use_tqdm=False)):
                file.write(json.dumps({"key": todo[i][0], "value": {"prompt_ids": prompts[i], "text": output.text,
                                                                      "request": todo[i][1]}}) + "\n")
            file.flush()
            print(f"{start + len(rows)} of {len(todo)}", file=sys.stderr)
    return 0


def recall(paths: list[str], texts: int, out: Path) -> dict:
    outputs = read_outputs(paths)
    index = {o["text"]: i for i, o in enumerate(outputs)}
    held = [o["text"] for o in read_outputs(paths[:1]) if int(o["prompt"][:2], 16) % 2 == 1][:texts]
    rewrites = _rewrites(held, out.with_name(out.stem + "-rewrites.json"))
    vocab = load_vocabulary()
    texts = [o["text"] for o in outputs]
    memory_words = signatures(vocab, token_ids(vocab, texts))
    null = ParaphraseNull.from_dict(json.loads(NULL_FILE.read_text()))
    sources = np.array([index[text] for text in held])
    result = {"threshold": null.threshold, "memory_outputs": len(outputs), "texts": len(held), "kinds": {}}
    for kind in ("sentence_by_sentence", "whole"):
        rewritten = [r[kind] for r in rewrites]
        words = word_similarities(signatures(vocab, token_ids(vocab, rewritten)), memory_words)
        best, column = best_of(words)
        at_source = words[np.arange(len(held)), sources]
        nearest = column == sources
        result["kinds"][kind] = {"recognised": int(((best >= null.threshold) & nearest).sum()),
                                 "nearest_is_source": int(nearest.sum()),
                                 "median_similarity": float(np.median(at_source))}
    return result


def _rewrites(held: list[str], cache: Path) -> list[dict]:
    """Each held output's two rewrites, from ``cache`` when it holds these outputs."""
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if [c["source"] for c in cached] == held:
            return cached
    loaded = load_model()
    engine = Engine(loaded, max_num_seqs=BATCH, max_model_len=1024)
    sentences = paraphrase(held, 1.0, 0, AttackContext(loaded.vocab.tokenizer, engine=engine))
    prompts = [engine.apply_chat_template([{"role": "user", "content": REWRITE.format(text=text)}]) for text in held]
    whole = engine.generate(prompts, [SamplingParams(max_new_tokens=300, temperature=PARAPHRASE_TEMPERATURE, seed=i)
                                      for i in range(len(held))], use_tqdm=False)
    made = [{"source": s, "sentence_by_sentence": a, "whole": w.text} for s, a, w in zip(held, sentences, whole)]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(made))
    return made


def _seed(name: str) -> int:
    """Request ``name``'s sampling seed (the engine's sampling does not depend on a request's batch-mates)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:7], "big")


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip().endswith("}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.chat_outputs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("generate", help="outputs of varied chat requests, as JSON lines")
    made.add_argument("--n", type=int, required=True)
    made.add_argument("--out", type=Path, required=True)
    made.add_argument("--tokens", type=int, default=200)
    made.add_argument("--home", type=Path, help="the keyring's home (default: PROVMARK_HOME)")
    made.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="the model's dtype (bfloat16 generates about 1.7 times as fast on a CPU with AVX-512 BF16)")
    found = commands.add_parser("recall", help="paraphrases of held-out outputs recognised at the shipped threshold")
    found.add_argument("--outputs", required=True, help="JSON-lines files of outputs, comma-separated")
    found.add_argument("--texts", type=int, default=300)
    found.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "generate":
        if args.n < 1 or args.tokens < 1:
            parser.error("--n and --tokens take positive numbers")
        return generate(args.n, args.out, args.tokens, args.home, args.dtype)
    paths = [p for p in args.outputs.split(",") if p]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing or args.texts < 1:
        parser.error(f"no such file: {', '.join(missing)}" if missing else "--texts takes a positive number")
    result = recall(paths, args.texts, args.out)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
