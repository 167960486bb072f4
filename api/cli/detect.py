"""``provmark detect``: score text for a watermark.

    provmark detect [FILE|-] [--key ID ... | --all-keys] [--watermark SPEC] [--windows] [--explain]
                    [--model DIR] [--json]
    provmark detect --jsonl IN.jsonl [...]      one {"text": ...} per line in, one verdict per line out

A JSON line may carry ``forced_positions`` (as ``provmark generate --json`` prints for constrained
output): those tokens had fewer than two allowed choices, carry no watermark, and are not scored.

Without --key every detection key of the keyring bound to the spec is tested (Holm-corrected); an
``hf:`` or ``hf:synthid`` spec is public and needs no key. ``--watermark`` takes kgw/hf specs and the
sampling watermarks (``gumbel:``, ``synthid:``, ``hf:synthid,...``, ``vllm:gumbel,...``), whose verdicts
carry the scheme's ``statistic`` instead of a green count. The exit status is 0 whatever the verdict; user errors (unknown key,
unreadable file, bad spec) exit 2 with a message. Output never contains a secret.
"""

from __future__ import annotations

import json
import sys

import torch

from api.cli.actions import DeprecatedFlag, Spelling
from api.cli.errors import CLIError
from detector.batch_secrets import KeySecrets, SecretsKeyring
from detector.calibration import Calibration, ShippedCalibrations
from detector.disclosure import with_spec_fingerprint
from detector.scoring_request import DetectOptions
from detector.service import Detector
from watermark.config import SpecError
from watermark.key_binding import same_colours
from watermark.key_info import KeyringError
from watermark.public_key import MAX_DOCUMENT_BYTES, PublicKey, PublicKeyError
from watermark.specs import parse_spec
from watermark.stats import Z_THRESHOLD
from watermark.vocab import ModelAssetError, load_vocabulary


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "detect", help="score text for a watermark",
        description="Score text for a watermark (exit 0 whatever the verdict).")
    parser.add_argument("file", nargs="?", default="-", metavar="FILE",
                        help="text file to score, or - for standard input (default)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--jsonl", metavar="IN.jsonl", help='score every {"text": ...} line; JSON lines out')
    parser.add_argument("--public-half", "--public-key", dest="public_key", metavar="FILE", action=Spelling,
                        current="--public-half",
                        help="verify with the public half of a two-part key (`provmark keys export-public`), no keyring "
                             "needed; a spoof made with the same public half passes this test: the key's owner tells "
                             "them apart (`--public-key`: its deprecated spelling, one release)")
    add_scoring_options(parser)
    parser.set_defaults(func=run)


def add_scoring_options(parser) -> None:
    """Keys, spec, windows, explain, tokenizer, normalisation, dedup and threshold (detect, detect-batch)."""
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--key", action="append", dest="keys", metavar="ID",
                      help="test this key (repeat for several); default: every detection key")
    keys.add_argument("--all-keys", action=DeprecatedFlag, current="no --key (every detection key is the default)",
                      help="deprecated for one release: leave --key out to test every detection key")
    parser.add_argument("--watermark", metavar="SPEC",
                        help="watermark spec (default: the --key keys' own spec, else the default kgw spec); also "
                             "gumbel:..., synthid:..., hf:synthid,... and vllm:gumbel,...")
    parser.add_argument("--windows", action="store_true", help="also search for a watermarked passage (WinMax)")
    parser.add_argument("--explain", action="store_true", help="per-token green/red flags with offsets")
    parser.add_argument("--model", metavar="PATH", help="local Hugging Face folder or GGUF file whose tokenizer to use")
    parser.add_argument("--no-normalize", action="store_true", help="score the text exactly as given")
    parser.add_argument("--no-dedup", action="store_true", help="count repeated n-grams every time")
    threshold = parser.add_mutually_exclusive_group()
    threshold.add_argument("--z-threshold", type=float, default=Z_THRESHOLD, metavar="Z",
                           help=f"verdict threshold (default {Z_THRESHOLD})")
    threshold.add_argument("--fpr", type=float, metavar="P", help="target false-positive rate instead of a z")


def run(args) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # scoring works on small tensors: a thread pool only adds contention
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # the CLI may run inside a longer-lived process (tests)


def _run(args) -> int:
    try:
        spec = parse_spec(args.watermark or None)
    except SpecError as exc:
        raise CLIError(f"bad --watermark: {exc}") from None
    if args.keys and not spec.needs_key:
        raise CLIError("--key: an hf spec is public and takes no key")
    if args.public_key:
        detector, spec, keys = _published_half_detector(args)
    else:
        detector, keys = _detector(args.model), args.keys
    named = args.watermark or None
    if named is None and args.keys and not args.public_key:  # the keys' own spec, as `provmark generate --key ID` writes it
        try:
            spec = detector.own_spec(args.keys) or spec
        except KeyringError as exc:  # KeySpecError: keys bound to different specs
            raise CLIError(str(exc)) from None
    options = dict(keys=keys if spec.needs_key else None, spec=spec, windows=args.windows,
                   explain=args.explain, normalize=not args.no_normalize, dedup=not args.no_dedup,
                   z_threshold=args.z_threshold, fpr=args.fpr)
    if args.jsonl:
        return _run_jsonl(detector, args.jsonl, options)
    verdict = _detect(detector, _read_text(args.file), options)
    if args.json:
        print(json.dumps(with_spec_fingerprint(verdict.to_dict()), indent=2))
    else:
        print(format_verdict(verdict))
    return 0


def _detector(model: str | None):
    try:
        vocab = load_vocabulary(model)
    except (ModelAssetError, OSError, ValueError) as exc:
        raise CLIError(f"cannot load the tokenizer: {exc}") from None
    return Detector(vocab=vocab)


def _published_half_detector(args):
    """(Detector, spec, [key id]) testing only the public half in ``args.public_key``: a PublicKey document
    checked against the tokenizer in use, its calibration as the guard (``detector.calibration``)."""
    if args.keys or args.all_keys:
        raise CLIError("--public-half: the document names its key; pass no --key")
    try:
        with open(args.public_key, "rb") as handle:
            document = PublicKey.from_json(handle.read(MAX_DOCUMENT_BYTES + 1))
    except OSError as exc:
        raise CLIError(f"cannot read {args.public_key}: {exc.strerror or exc}") from None
    except PublicKeyError as exc:
        raise CLIError(f"{args.public_key}: {exc}") from None
    spec = parse_spec(document.spec)
    if args.watermark and not same_colours(parse_spec(args.watermark), spec):
        raise CLIError(f"--watermark: the published key is bound to {document.spec}")
    try:
        vocab = load_vocabulary(args.model)
    except (ModelAssetError, OSError, ValueError) as exc:
        raise CLIError(f"cannot load the tokenizer: {exc}") from None
    if (vocab.fingerprint, vocab.vocab_size) != (document.tokenizer_fingerprint, document.vocab_size):
        raise CLIError(f"{args.public_key}: the key is defined over {document.model_id}'s tokenizer "
                       f"(fingerprint {document.tokenizer_fingerprint}); pass that model's folder with --model")
    shipped = {}
    if document.calibration is not None:
        try:
            calibration = Calibration.from_dict({**document.calibration, "key_id": document.key_id})
        except (KeyError, TypeError, ValueError):
            raise CLIError(f"{args.public_key}: calibration: not a calibration record") from None
        shipped[f"{document.key_id}|{calibration.spec_fingerprint}"] = calibration.to_dict()
    keyring = SecretsKeyring(KeySecrets({document.key_id: document.secret}))
    return Detector(vocab=vocab, keyring=keyring, calibrations=ShippedCalibrations(shipped)), spec, [document.key_id]


def _detect(detector, text: str, options: dict):
    options = dict(options)
    try:
        keys, spec = options.pop("keys"), options.pop("spec")
        return detector.detect(text, keys=keys, spec=spec, options=DetectOptions(**options))
    except KeyringError as exc:  # keyring messages never carry secrets
        raise CLIError(str(exc)) from None
    except (SpecError, ValueError) as exc:
        raise CLIError(str(exc)) from None


def _read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise CLIError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None


def _run_jsonl(detector, path: str, options: dict) -> int:
    """One verdict per input line, in order; a malformed line stops the run with its line number."""
    try:
        handle = sys.stdin if path == "-" else open(path, encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                record = parse_record(line, path, number)
                record_options = options
                if record.get("forced_positions"):  # e.g. `provmark generate --json` output of a constrained run
                    record_options = {**options, "forced_positions": record["forced_positions"]}
                verdict = with_spec_fingerprint(_detect(detector, record["text"], record_options).to_dict())
                if "id" in record:
                    verdict = {"id": record["id"], **verdict}
                print(json.dumps(verdict, separators=(",", ":")), flush=False)
        except UnicodeDecodeError as exc:
            raise CLIError(f"{path}: not UTF-8 text ({exc.reason})") from None
    sys.stdout.flush()
    return 0


def parse_record(line: str, path: str, number: int) -> dict:
    """One JSONL line as a record with a string "text"; a CLIError names the file and line otherwise."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise CLIError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise CLIError(f'{path}:{number}: expected an object with a string "text" field')
    return record


def format_verdict(verdict) -> str:
    """A few lines for people."""
    d = verdict.to_dict()
    z = "n/a" if d["z_score"] is None else f"{d['z_score']:.2f}"
    lines = [
        f"verdict: {d['verdict']}" + (f" (decided by the best {d['decided_by']})" if d["decided_by"] == "window" else ""),
        f"z = {z}, p = {d['p_value']:.3g} (exact {_test_name(d)}, {d['correction']} over {len(d['keys'])} key(s)); "
        + _counts_line(d),
        f"key: {d['key_id'] or '-'}; watermark: {d['watermark']}",
    ]
    public = d.get("public_half")
    if public is not None:  # a two-part key: what its public half says, and whether that was spoofed
        z = "n/a" if public["z_score"] is None else f"{public['z_score']:.2f}"
        lines.append(f"public half ({public['fingerprint']}): {public['verdict']}, z = {z}; paired test of the "
                     f"halves p = {public['spoof_test']['p_value']:.3g}"
                     + ("; SPOOF SUSPECTED: green under the public half only" if d["spoof_suspected"] else ""))
    if d["normalizations"]:
        lines.append("normalised: " + ", ".join(d["normalizations"]))
    windows = d["windows"]
    if windows is not None:
        best = windows["best"]
        if best is None:
            lines.append("windows: text too short for windows")
        else:
            lines.append(
                f"best window: characters {best['char_start']}-{best['char_end']}, z = {best['z_score']:.2f}, "
                f"p = {best['p_value_corrected']:.3g} corrected over {windows['num_windows_tested']} windows"
                + (" (watermarked passage)" if windows["detected"] else ""))
    if d["explanation"] is not None and d.get("statistic") is not None:
        lines.append("tokens (value: Gumbel score s or SynthID g-values; . unscored, * repeat not counted):")
        for token in d["explanation"]:
            repeat = "*" if token["scored"] and not token["counted"] else " "
            value = token.get("score", token.get("g_values"))
            shown = "." if value is None else (f"{value:.3f}" if isinstance(value, float) else "".join(map(str, value)))
            lines.append(f"  {shown}{repeat} {token['char_start']:>6}-{token['char_end']:<6} {token['text']!r}")
    elif d["explanation"] is not None:
        marks = {True: "G", False: "r", None: "."}
        lines.append("tokens (G green, r red, . unscored, * repeat not counted):")
        for token in d["explanation"]:
            repeat = "*" if token["scored"] and not token["counted"] else " "
            lines.append(f"  {marks[token['green']]}{repeat} {token['char_start']:>6}-{token['char_end']:<6} "
                         f"{token['text']!r}")
    return "\n".join(lines)


def _test_name(d: dict) -> str:
    statistic = d.get("statistic")
    if statistic is None:
        return "binomial"
    return "Gamma tail" if statistic["name"] == "gumbel_sum" else "binomial of g-values"


def _counts_line(d: dict) -> str:
    """KGW: green of scored; sampling specs: the scheme's statistic over the scored units."""
    statistic = d.get("statistic")
    if statistic is None:
        return f"green {d['num_green_tokens']} of {d['num_tokens_scored']} scored tokens"
    if statistic["name"] == "gumbel_sum":
        return f"Gumbel sum {statistic['sum']:.2f} over {d['num_tokens_scored']} scored tokens"
    mean = "n/a" if statistic["mean_g"] is None else f"{statistic['mean_g']:.4f}"
    weighted = "n/a" if statistic["weighted_mean_g"] is None else f"{statistic['weighted_mean_g']:.4f}"
    return (f"g = 1 in {statistic['ones']} of {statistic['trials']} (mean g {mean}, weighted {weighted}) "
            f"over {d['num_tokens_scored']} scored tokens")
