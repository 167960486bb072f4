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
import json
import sys
from pathlib import Path

from api.cli.errors import CLIError
from api.cli.keys import _audit
from watermark.config import SpecError, WatermarkSpec
from watermark.key_info import KeyringError
from watermark.keys import Keyring
from watermark.vocab import load_vocabulary

# (flag, SamplingParams field, type, help); every sampler option of the engine
SAMPLER_OPTIONS = [
    ("--max-new-tokens", "max_new_tokens", int, "tokens to generate at most (default 128)"),
    ("--min-new-tokens", "min_new_tokens", int, "suppress end-of-text before this many tokens"),
    ("--temperature", "temperature", float, "0 = greedy (default 1.0)"),
    ("--top-k", "top_k", int, "keep the k most likely tokens (0 = off)"),
    ("--top-p", "top_p", float, "nucleus sampling mass (1 = off)"),
    ("--min-p", "min_p", float, "drop tokens below min_p x the top probability"),
    ("--typical-p", "typical_p", float, "locally typical sampling mass (1 = off)"),
    ("--epsilon-cutoff", "epsilon_cutoff", float, "truncation sampling: drop p < epsilon"),
    ("--eta-cutoff", "eta_cutoff", float, "eta sampling (entropy-dependent cut-off)"),
    ("--mirostat", "mirostat_mode", int, "mirostat version: 0 off, 1, 2"),
    ("--mirostat-tau", "mirostat_tau", float, "mirostat target surprise (bits)"),
    ("--mirostat-eta", "mirostat_eta", float, "mirostat learning rate"),
    ("--repetition-penalty", "repetition_penalty", float, "CTRL-style penalty (1 = off)"),
    ("--presence-penalty", "presence_penalty", float, "OpenAI-style presence penalty"),
    ("--frequency-penalty", "frequency_penalty", float, "OpenAI-style frequency penalty"),
    ("--no-repeat-ngram-size", "no_repeat_ngram_size", int, "ban repeating n-grams of this size"),
    ("--seed", "seed", int, "seed: the same seed gives the same tokens"),
    ("--logprobs", "logprobs", int, "report the chosen token's logprob and this many top ones"),
]


EARLY_STOPPING_CHOICES = {"true": True, "false": False, "never": "never"}
SPECULATIVE_METHODS = {"prompt-lookup": "prompt_lookup", "draft": "draft"}

# (flag, method config, config field, type, help): the one mapping from decoding flags to config fields.
# The first row of each method is its switch: the method's other flags need it.
DECODING_OPTIONS = [
    ("--num-beams", "beam", "num_beams", int, "beam search with this many beams"),
    ("--length-penalty", "beam", "length_penalty", float, "beam score = logprob sum / length ** this (default 1.0)"),
    ("--early-stopping", "beam", "early_stopping", EARLY_STOPPING_CHOICES.get,
     "true: stop once num-beams beams finished; false (default): when none can improve (heuristic); never: exact"),
    ("--speculative", "speculative", "method", SPECULATIVE_METHODS.get, "speculative decoding drafter"),
    ("--num-speculative-tokens", "speculative", "num_speculative_tokens", int, "tokens drafted per target forward"),
    ("--prompt-lookup-max", "speculative", "prompt_lookup_max", int, "prompt lookup: longest n-gram matched"),
    ("--prompt-lookup-min", "speculative", "prompt_lookup_min", int, "prompt lookup: shortest n-gram matched"),
    ("--draft-model", "speculative", "draft_model", str, "draft model folder sharing the tokenizer ('default' = embedded)"),
    ("--contrastive-amateur", "contrastive", "amateur_model", str, "contrastive decoding against this amateur model folder"),
    ("--contrastive-alpha", "contrastive", "alpha", float, "plausibility cut-off: fraction of the expert's top probability"),
    ("--contrastive-beta", "contrastive", "beta", float, "weight of the amateur's log-probabilities"),
    ("--mbr", "mbr", "num_candidates", int, "minimum Bayes risk decoding over this many sampled candidates"),
    ("--mbr-similarity", "mbr", "similarity", str, "MBR similarity: chrf (default) or token_f1"),
]
DECODING_CHOICES = {"--early-stopping": list(EARLY_STOPPING_CHOICES), "--speculative": list(SPECULATIVE_METHODS)}
DECODING_METAVARS = {"--draft-model": "DIR", "--contrastive-amateur": "DIR", "--mbr-similarity": "NAME"}
CONFIG_CLASSES = {"beam": "BeamConfig", "speculative": "SpeculativeConfig", "contrastive": "ContrastiveConfig",
                  "mbr": "MBRConfig"}
# the module each method's config class lives in, imported only when that method is asked for
CONFIG_MODULES = {"beam": "generation.decoding.beam", "speculative": "generation.decoding.speculative.decode",
                  "contrastive": "generation.decoding.contrastive", "mbr": "generation.decoding.mbr"}


def _dest(flag: str) -> str:
    return "decoding_" + flag.lstrip("-").replace("-", "_")


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
    mark.add_argument("--watermark", metavar="SPEC", help="watermark spec (default: the default kgw spec)")
    mark.add_argument("--no-watermark", action="store_true", help="generate without a watermark")
    p.add_argument("--key", metavar="ID", help="keyring key id (default: the active key)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--model", metavar="DIR", help="a local Hugging Face model folder (default: embedded SmolLM2)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 (default: float32 on CPU)")
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


def _sampling_params(args, tokenizer):
    # local: torch loads only for the commands that score or generate
    from generation.sample.sampler import SamplingParams

    values = {field: getattr(args, field) for _, field, _, _ in SAMPLER_OPTIONS if getattr(args, field) is not None}
    if args.logit_bias:
        bias = {}
        for item in args.logit_bias:
            token, sep, value = item.partition("=")
            try:
                bias[int(token)] = float(value)
            except ValueError:
                raise CLIError(f"--logit-bias: expected TOKEN_ID=BIAS, got {item!r}") from None
            if not sep:
                raise CLIError(f"--logit-bias: expected TOKEN_ID=BIAS, got {item!r}")
        values["logit_bias"] = bias
    if args.bad_word:
        values["bad_words_ids"] = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in args.bad_word]
    if args.stop:
        values["stop"] = args.stop
    if args.stop_token_id:
        values["stop_token_ids"] = args.stop_token_id
    values["ignore_eos"] = args.ignore_eos
    constraint = _constraint(args)
    if constraint is not None:
        values["constraint"] = constraint
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise CLIError(_option_message(str(exc))) from None


def _constraint(args):
    """The ConstraintSpec the constraint flags ask for (None without one); errors name the flag."""
    # local: torch loads only for the commands that score or generate
    from generation.constraints.constraint import ConstraintError, ConstraintSpec

    if args.regex is not None:
        flag, fields = "--regex", {"regex": args.regex}
    elif args.json_schema is not None:
        flag, fields = "--json-schema", {"json_schema": _schema_text(args.json_schema)}
    elif args.choice is not None:
        flag, fields = "--choice", {"choice": args.choice}
    elif args.allowed_token_id is not None:
        flag, fields = "--allowed-token-id", {"allowed_token_ids": _token_ids(args.allowed_token_id)}
    else:
        return None
    try:
        return ConstraintSpec(**fields)
    except ConstraintError as exc:
        raise CLIError(_constraint_message(flag, exc)) from None


CONSTRAINT_FLAGS = {"regex": "--regex", "json_schema": "--json-schema", "choice": "--choice",
                    "allowed_token_ids": "--allowed-token-id"}


def _constraint_message(flag: str, exc: Exception) -> str:
    """ConstraintSpec / compiler errors start with the spec field; the user typed a flag."""
    field, sep, rest = str(exc).partition(": ")
    return f"{flag}: {rest}" if sep and field in CONSTRAINT_FLAGS else f"{flag}: {exc}"


def _constraint_flag(params) -> str:
    return CONSTRAINT_FLAGS[params.constraint.kind] if params.constraint is not None else "constraint"


def _schema_text(value: str) -> str:
    """--json-schema takes inline JSON (starts with { or a JSON literal) or a file path."""
    if value.lstrip().startswith(("{", "[")) or value.strip() in ("true", "false"):
        return value
    path = Path(value)
    if not path.is_file():
        raise CLIError(f"--json-schema: {value!r} is neither inline JSON nor a readable file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"--json-schema: cannot read {value}: {exc}") from None


def _token_ids(items: list[str]) -> list[int]:
    ids = []
    for item in items:
        for part in item.split(","):
            try:
                ids.append(int(part.strip()))
            except ValueError:
                raise CLIError(f"--allowed-token-id: expected integer token ids, got {part.strip()!r}") from None
    if any(i < 0 for i in ids):
        raise CLIError(f"--allowed-token-id: token ids must be >= 0, got {min(ids)}")
    return ids


def _decoding_params(args):
    """DecodingParams from the decoding flags (None when none asks for more than plain generation)."""
    given = {flag: getattr(args, _dest(flag)) for flag, *_ in DECODING_OPTIONS if getattr(args, _dest(flag)) is not None}
    switches = {method: flag for flag, method, *_ in reversed(DECODING_OPTIONS)}  # each method's first row
    methods = []
    for flag, method, _, _, _ in DECODING_OPTIONS:
        if flag in given and method not in methods:
            if switches[method] not in given:
                raise CLIError(f"{flag}: only used with {switches[method]}")
            methods.append(method)
    if len(methods) > 1:
        raise CLIError(f"{switches[methods[0]]} and {switches[methods[1]]}: choose one decoding method")
    plain = not methods and (args.n is None or args.n == 1) and (args.best_of is None or args.best_of == 1)
    if plain:
        return None
    # local: torch loads only for the commands that score or generate
    from generation.decoding import DecodingParams

    configs = {}
    if methods:
        method = methods[0]
        fields = {field: kind(given[flag]) if flag in DECODING_CHOICES else given[flag]
                  for flag, m, field, kind, _ in DECODING_OPTIONS if m == method and flag in given}
        try:
            configs[method] = _config_class(method)(**fields)
        except ValueError as exc:
            raise CLIError(_option_message(str(exc))) from None
    try:
        return DecodingParams(n=args.n if args.n is not None else 1, best_of=args.best_of, **configs)
    except ValueError as exc:
        raise CLIError(_option_message(str(exc))) from None


def _config_class(method: str):
    import importlib

    return getattr(importlib.import_module(CONFIG_MODULES[method]), CONFIG_CLASSES[method])


def _check_decoding(params, decoding) -> None:
    """Settings the decoding method cannot honour, caught before the model loads (ValueError)."""
    if decoding is None:
        return
    if decoding.method == "beam":
        # local: torch loads only for the commands that score or generate
        from generation.decoding.beam import check_beam_params

        check_beam_params(params)
    elif decoding.method is None:
        # local: torch loads only for the commands that score or generate
        from generation.decoding.best_of import check_best_of_params

        check_best_of_params(params, decoding.num_samples)


def _print_decoded(outputs, as_json: bool) -> int:
    if as_json:
        print(json.dumps(decoded_json(outputs), ensure_ascii=False))
    elif len(outputs) == 1:
        sys.stdout.write(outputs[0].text + "\n")
    else:
        for i, out in enumerate(outputs):
            sys.stdout.write(f"=== choice {i} ===\n{out.text}\n")
    sys.stdout.flush()
    return 0


def decoded_json(outputs) -> dict:
    """The first output's fields at the top level, plus ``choices`` when there are several."""
    body = result_json(outputs[0])
    if len(outputs) > 1:
        body["choices"] = [{"index": i, "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason,
                            "cumulative_logprob": o.cumulative_logprob,
                            **({"decoding_stats": o.decoding_stats} if o.decoding_stats is not None else {})}
                           for i, o in enumerate(outputs)]
    return body


def _option_message(text: str) -> str:
    """SamplingParams / decoding config errors name fields; the user typed flags."""
    for flag, method, field, _, _ in DECODING_OPTIONS:
        text = text.replace(f"{CONFIG_CLASSES[method]}.{field}=", f"{flag} ")
    text = text.replace("DecodingParams.n=", "-n ").replace("DecodingParams.best_of=", "--best-of ")
    for flag, field, _, _ in SAMPLER_OPTIONS:
        text = text.replace(f"SamplingParams.{field}=", f"{flag} ")
    text = text.replace("SamplingParams.constraint.allowed_token_ids=", "--allowed-token-id ")
    return text.replace("SamplingParams.", "")


def _watermark(args, vocab):
    # local: torch loads only for the commands that score or generate
    from watermark.scheme import generation_watermark

    if args.no_watermark:
        if args.key:
            raise CLIError("--key: nothing to key with --no-watermark")
        return None
    try:
        if args.key is None and (args.watermark is None or WatermarkSpec.parse(args.watermark).needs_key):
            _ensure_key(vocab)
        return generation_watermark(args.watermark, vocab.vocab_size, key_id=args.key, create_if_missing=True)
    except (SpecError, KeyringError, ValueError) as exc:
        raise CLIError(str(exc)) from None


def _ensure_key(vocab) -> None:
    """A first key, screened and calibrated like `provmark keys create` makes it, on an empty keyring."""
    # local: torch loads only for the commands that score or generate
    from detector.calibrate import ensure_screened_active_key

    keyring = Keyring()
    info, calibration = ensure_screened_active_key(keyring, vocab)
    if calibration is not None:
        print(f"provmark: created watermark key {info.key_id} (active, calibration {calibration['id']})", file=sys.stderr)
        _audit([("create", info), ("calibrate", info, calibration)])


def run(args) -> int:
    # local: torch loads only for the commands that score or generate
    from generation.constraints.constraint import ConstraintError
    from generation.engine import Engine
    from generation.models import load_model

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CLIError("prompt: empty")
    decoding = _decoding_params(args)
    try:  # everything that can be wrong with the request is checked before the weights load
        vocab = load_vocabulary(args.model)
        params = _sampling_params(args, vocab.tokenizer)
        params.validate_for_vocab(vocab.vocab_size)
        _check_decoding(params, decoding)
        watermark = _watermark(args, vocab)
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(_option_message(str(exc))) from None
    engine = Engine(loaded, max_num_seqs=1)
    prompt_input = engine.apply_chat_template([{"role": "user", "content": prompt}]) if args.chat else prompt
    try:
        if decoding is not None:
            try:
                outputs = engine.decode(prompt_input, params, decoding, watermark=watermark)
            except OSError as exc:  # e.g. a draft / amateur model folder that is not there
                raise CLIError(_option_message(str(exc))) from None
            return _print_decoded(outputs, args.json)
        if args.json:
            out = engine.generate([prompt_input], params, watermarks=[watermark], use_tqdm=False)[0]
            print(json.dumps(result_json(out), ensure_ascii=False))
            return 0
        for delta in engine.stream(prompt_input, params, watermark=watermark):
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except ConstraintError as exc:  # the grammar cannot be followed with this vocabulary
        raise CLIError(_constraint_message(_constraint_flag(params), exc)) from None
    except ValueError as exc:
        raise CLIError(_option_message(str(exc))) from None
    return 0


def result_json(out) -> dict:
    body = {
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "usage": {"prompt_tokens": out.usage.prompt_tokens, "completion_tokens": out.usage.completion_tokens,
                  "total_tokens": out.usage.total_tokens},
        "watermark": None if out.watermark is None else {
            "spec": out.watermark.spec, "key_id": out.watermark.key_id, "fingerprint": out.watermark.fingerprint},
    }
    body["forced_positions"] = out.forced_positions
    if out.error is not None:
        body["error"] = out.error
    if out.logprobs is not None:
        body["logprobs"] = out.logprobs
        body["top_logprobs"] = out.top_logprobs
    if out.cumulative_logprob is not None:
        body["cumulative_logprob"] = out.cumulative_logprob
    if out.decoding_stats is not None:
        body["decoding_stats"] = out.decoding_stats
    return body
