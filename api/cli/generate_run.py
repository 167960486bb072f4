"""What ``provmark generate`` does once its flags are parsed (``api.cli.generate`` defines them): the
sampling, constraint, decoding and watermark settings from the flags, checked at the door, then the
engine's run, streamed or as JSON."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from api.cli.errors import CLIError
from api.cli.generate_options import (
    CONFIG_CLASSES,
    CONFIG_MODULES,
    DECODING_CHOICES,
    DECODING_OPTIONS,
    SAMPLER_OPTIONS,
    _dest,
)
from api.cli.keys.audit import KeyEvent, record_key_events
from detector.calibrate import ensure_screened_active_key
from generation.constraints.constraint import ConstraintError, ConstraintSpec
from generation.decoding import DecodingParams
from generation.decoding.beam import check_beam_params
from generation.decoding.best_of import check_best_of_params
from generation.decoding.params import check_sampling_method
from generation.engine import Engine
from generation.models import load_model
from generation.runner import ComputePaths
from generation.sample.sampler import SamplingParams
from generation.sample.sampling_stage import check_spec
from watermark.config import SpecError
from watermark.key_binding import bound_spec, require_generation_bound
from watermark.key_info import ACTIVE, KeyringError
from watermark.keys import Keyring
from watermark.scheme import generation_watermark
from watermark.specs import is_sampling, parse_spec
from watermark.vocab import load_vocabulary


def _sampling_params(args, tokenizer):

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
    return getattr(importlib.import_module(CONFIG_MODULES[method]), CONFIG_CLASSES[method])


def _check_decoding(params, decoding) -> None:
    """Settings the decoding method cannot honour, caught before the model loads (ValueError)."""
    if decoding is None:
        return
    if decoding.method == "beam":

        check_beam_params(params)
    elif decoding.method is None:

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


def _watermark(args, vocab, params, decoding):

    if args.no_watermark:
        if args.key:
            raise CLIError("--key: nothing to key with --no-watermark")
        return None
    try:
        spec = parse_spec(args.watermark) if args.watermark is not None else _key_spec(args.key)
        check_spec(spec, params)  # greedy with a sampling watermark: refused before a key or the model
        if decoding is not None:
            check_sampling_method(spec, params, decoding.method, decoding.num_samples)
        if args.key is None and spec.needs_key:
            _ensure_key(vocab, spec)
        mark = generation_watermark(spec, vocab.vocab_size, key_id=args.key, create_if_missing=True)
        require_generation_bound(mark, Keyring())  # a key writes only its own colours
        return mark
    except (SpecError, KeyringError, ValueError) as exc:
        raise CLIError(str(exc)) from None


def _key_spec(key_id: str | None):
    """The spec of the named key, or of the active one: a request naming no spec writes the key's own
    (the default spec when there is no key yet: the first key is made for it)."""
    keyring = Keyring()
    if key_id is None:
        info = next((k for k in keyring.list() if k.status == ACTIVE), None)
    else:
        info = next((k for k in keyring.list() if k.key_id == key_id), None)
    return parse_spec(None) if info is None else bound_spec(info)


def _ensure_key(vocab, spec) -> None:
    """A first key, screened and calibrated like `provmark keys create` makes it, on an empty keyring; for a
    sampling spec (gumbel, synthid) a first key bound to that spec (screening and calibration are KGW's)."""

    keyring = Keyring()
    if is_sampling(spec):
        if not any(k.status == ACTIVE for k in keyring.list()):
            info = keyring.create(spec=spec)
            print(f"provmark: created watermark key {info.key_id} (active, bound to {spec.format()})", file=sys.stderr)
            record_key_events([KeyEvent("create", info)])
        return
    info, calibration = ensure_screened_active_key(keyring, vocab)
    if calibration is not None:
        print(f"provmark: created watermark key {info.key_id} (active, calibration {calibration['id']})", file=sys.stderr)
        record_key_events([KeyEvent("create", info), KeyEvent("calibrate", info, calibration)])


def run(args) -> int:

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CLIError("prompt: empty")
    decoding = _decoding_params(args)
    try:  # everything that can be wrong with the request is checked before the weights load
        vocab = load_vocabulary(args.model)
        params = _sampling_params(args, vocab.tokenizer)
        params.validate_for_vocab(vocab.vocab_size)
        _check_decoding(params, decoding)
        watermark = _watermark(args, vocab, params, decoding)
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(_option_message(str(exc))) from None
    # one request; beams / best_of siblings share the engine's KV pool, so it is sized for that many sequences
    try:
        engine = Engine(loaded, max_num_seqs=_branch_count(decoding),
                        paths=ComputePaths(int8_weights=args.weights == "int8"))
    except ValueError as exc:  # int8 weights on a model or machine that cannot run them
        raise CLIError(f"--weights: {exc}") from None
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


def _branch_count(decoding) -> int:
    """Sequences the request holds in the KV pool at once: its beams or best_of siblings, else 1."""
    if decoding is None:
        return 1
    if decoding.beam is not None:
        return decoding.beam.num_beams
    return decoding.num_samples if decoding.method is None else 1


def result_json(out) -> dict:
    body = {
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
        "usage": {"prompt_tokens": out.usage.prompt_tokens, "completion_tokens": out.usage.completion_tokens,
                  "total_tokens": out.usage.total_tokens},
        "watermark": None if out.watermark is None else {
            "spec": out.watermark.spec, "key_id": out.watermark.key_id,
            "spec_fingerprint": out.watermark.fingerprint, "fingerprint": out.watermark.fingerprint},
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
