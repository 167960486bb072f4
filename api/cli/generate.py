"""``provmark generate``: watermarked generation from the command line.

Watermarking with the keyring's active key is on by default (a first key is created on an empty
keyring); ``--no-watermark`` turns it off, ``--watermark SPEC`` and ``--key ID`` choose.
``--temperature 0`` means greedy, as in the OpenAI and vLLM APIs.

Constrained output (one of): ``--regex R`` (the whole output matches R), ``--json-schema FILE|JSON``,
``--choice TEXT`` (repeatable: the output is one of them), ``--allowed-token-id ID`` (repeatable or
comma-separated: every token comes from the set). ``--json`` then also reports ``forced_positions``:
generated-token indices the constraint left fewer than two choices, which carry no watermark.

Advanced decoding (one method at most; see generation/decoding): ``--num-beams K`` beam search
(``--length-penalty``, ``--early-stopping``); ``-n N`` outputs, the N most likely of ``--best-of M``
samples; ``--speculative prompt-lookup|draft``; ``--contrastive-amateur DIR``; ``--mbr N`` candidates.
These print the finished text (no streaming); with several outputs each comes under a ``=== choice i ===``
line, and ``--json`` adds a ``choices`` list (the top-level fields describe the first choice).
"""

from __future__ import annotations

import argparse

from api.cli.errors import CLIError
from api.cli.generate_options import (
    DECODING_CHOICES,
    DECODING_METAVARS,
    DECODING_OPTIONS,
    SAMPLER_OPTIONS,
    _dest,
)


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate (watermarked) text",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", help="the prompt, or - to read it from standard input")
    for flag, field, kind, text in SAMPLER_OPTIONS:
        p.add_argument(flag, dest=field, type=kind, default=None, help=text)
    p.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN_ID=BIAS",
                   help="add BIAS to a token's logit (repeatable)")
    p.add_argument("--bad-word", action="append", default=[], metavar="TEXT",
                   help="never generate this text's tokens (repeatable)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--stop-token-id", action="append", type=int, default=[], metavar="ID",
                   help="stop token id (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-text")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--regex", metavar="R", help="the output must fully match this regular expression")
    shape.add_argument("--json-schema", metavar="FILE|JSON", help="the output must be JSON valid under this schema")
    shape.add_argument("--choice", action="append", metavar="TEXT", help="the output must be one of these (repeatable)")
    shape.add_argument("--allowed-token-id", action="append", metavar="ID",
                       help="every token must come from these ids (repeatable, or a comma list)")
    mark = p.add_mutually_exclusive_group()
    mark.add_argument("--watermark", metavar="SPEC", help="watermark spec (default: the key's own spec; see `provmark keys list`)")
    mark.add_argument("--no-watermark", action="store_true", help="generate without a watermark")
    p.add_argument("--key", action="append", dest="keys", metavar="ID",
                   help="keyring key id (default: the active key); the same option as detect's, given once here: "
                        "a text is marked with one key")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder or GGUF file (default: embedded SmolLM2)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 (default: float32 on CPU)")
    p.add_argument("--weights", choices=("float", "int8"), default="float",
                   help="int8: every linear on int8 weights, a scale per output (opt-in, CPU, float32; faster, "
                        "perplexity about 0.1%% higher on the default model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    decoding = p.add_argument_group("advanced decoding (one method at most)")
    decoding.add_argument("-n", "--n", dest="n", type=int, default=None, help="outputs to return (default 1)")
    decoding.add_argument("--best-of", dest="best_of", type=int, default=None, metavar="M",
                          help="sample this many and return the n with the highest cumulative logprob")
    for flag, _, _, kind, text in DECODING_OPTIONS:
        choices = DECODING_CHOICES.get(flag)
        metavar = None if choices else DECODING_METAVARS.get(flag, {int: "N", float: "X"}.get(kind, "VALUE"))
        decoding.add_argument(flag, dest=_dest(flag), type=str if choices else kind, choices=choices,
                              default=None, metavar=metavar, help=text)
    p.set_defaults(func=run)


def run(args) -> int:
    from api.cli import generate_run  # noqa: PLC0415 (transformers and the engine load for `generate` only)

    if args.keys is not None and len(args.keys) > 1:
        raise CLIError(f"--key: a text is marked with one key; got {len(args.keys)}")
    args.key = args.keys[0] if args.keys else None
    return generate_run.run(args)
