"""``provmark receipts``: check a generation receipt offline, and manage the key that signs them.

  provmark receipts verify RECEIPT --jwks FILE|URL [--text FILE] [--allow-http] [--json]
        RECEIPT: a file (or - for standard input) holding a compact JWS receipt, a receipt object, or a
        whole response of the generation service. Exit 0: it verifies (and the text matches, with
        --text); 1: it does not; 2: bad input. A key's ``retired_at`` is honoured: what it signed after
        its retirement fails. Receipts from before the JWS (a ``signature`` over canonical JSON) are
        checked with the JWKS key their ``signer_id`` names, and show only the seven fields it covers.
        A JWKS URL must be https (``--allow-http`` for a local service), and its origin must be the receipt's
        ``iss`` (or the ``detector`` it names); from a file, the issuer is not checked (the output says so).
  provmark receipts jwks                       the deployment's JWKS (current and retired receipt keys)
  provmark receipts rotate-key [--json]        a new signing key for every replica; the old one stays in
                                               the JWKS, retired now (what it signs later fails)
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from api.cli.actions import add_action, usage
from api.cli.db import opened_store
from api.cli.documents import is_url, read_document
from api.cli.errors import CLIError
from api.cli.identity_keys import public_identity, signing_keys
from db.receipts import ReceiptError, verify_legacy_receipt, verify_receipt_jws
from db.rows import text_sha256
from provenance.text_credentials import visible_text

CLI_ACTOR = "cli"
MAX_DOCUMENT_BYTES = 1 << 20  # a JWKS or a receipt is a few KB
MAX_TEXT_BYTES = 16 << 20  # far above any text the services accept


def register(subparsers) -> None:
    parser = subparsers.add_parser("receipts", help="verify generation receipts and manage their signing key",
                                   description=__doc__.split("\n\n")[0].split(": ", 1)[1].capitalize())
    parser.set_defaults(func=lambda args: usage(parser))
    actions = parser.add_subparsers(dest="receipts_action", metavar="ACTION")
    check = add_action(actions, "verify", "verify a receipt offline against a JWKS", _verify)
    check.add_argument("receipt", metavar="RECEIPT", help="file with the receipt (JWS, receipt JSON or a response), "
                                                          "or - for standard input")
    check.add_argument("--jwks", required=True, metavar="FILE|URL",
                       help="the issuer's JWKS: a file, or its URL (e.g. http://host:8000/.well-known/jwks.json)")
    check.add_argument("--text", metavar="FILE", help="also check that this file holds the receipt's text")
    check.add_argument("--allow-http", action="store_true",
                       help="accept a JWKS URL over plain http (a local service; anyone on the path could swap it)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    add_action(actions, "jwks", "print this home's JWKS (current and retired receipt keys)", _jwks).add_argument(
        "--json", action="store_true", help="accepted for uniformity: the JWKS is JSON either way")
    rotate = add_action(actions, "rotate-key", "start signing receipts with a new key (the old one stays in "
                                               "the JWKS)", _rotate)
    rotate.add_argument("--json", action="store_true", help="machine-readable output")


def _verify(args) -> int:
    receipt = _receipt_of(read_document(args.receipt, MAX_DOCUMENT_BYTES, "RECEIPT"))
    if is_url(args.jwks) and not args.jwks.startswith("https://") and not args.allow_http:
        raise CLIError(f"--jwks {args.jwks} is plain http: anyone on the path could serve other keys; use its "
                       "https URL, or --allow-http for a service you reach locally")
    jwks = _json_of(read_document(args.jwks, MAX_DOCUMENT_BYTES, "--jwks"), "the JWKS")
    problems: list[str] = []
    form = "jws" if isinstance(receipt, str) else "legacy"
    try:
        claims = verify_receipt_jws(receipt, jwks) if form == "jws" else verify_legacy_receipt(receipt, jwks)
    except ReceiptError as error:
        claims = {}
        problems.append(str(error))
    issuer_checked = None
    if claims and is_url(args.jwks):
        origin = _origin(args.jwks)
        # the issuer, or the detector the signed receipt names as its own: both serve the deployment's JWKS
        issuer_checked = origin in (claims.get("iss"), _origin(str(claims.get("detector") or "")))
        if form == "jws" and not issuer_checked:
            problems.append(f"the receipt's issuer {claims.get('iss')!r} is not {origin!r}, where the JWKS came "
                            "from: check it against its own issuer's JWKS")
    if args.text is not None and not problems:
        text = visible_text(_read_text(args.text))
        if text_sha256(text) != claims.get("text_sha256"):
            problems.append(f"{args.text} does not hold the receipt's text (its SHA-256 differs)")
    result = {"ok": not problems, "form": form, "problems": problems, "issuer_checked": bool(issuer_checked),
              "receipt": {name: claims.get(name) for name in ("receipt_id", "iss", "created_at", "model_id",
                                                              "key_id", "spec_fingerprint", "text_sha256",
                                                              "c2pa_manifest_id") if name in claims}}
    if args.json:
        print(json.dumps(result, indent=2))
    elif problems:
        print("receipt does NOT verify: " + "; ".join(problems))
    else:
        print(f"receipt {claims['receipt_id']} verifies ({form}): {claims.get('model_id')} at {claims['created_at']}"
              + (f", issued by {claims['iss']}" if claims.get("iss") else "")
              + (", and the text matches" if args.text is not None else "")
              + ("" if issuer_checked or form == "legacy" else
                 "; the issuer was not checked (the JWKS came from a file: compare it with where you got it)"))
    return 0 if not problems else 1


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _jwks(args) -> int:
    with opened_store() as store:
        print(json.dumps(public_identity(store).jwks(), indent=2))
    return 0


def _rotate(args) -> int:
    with opened_store() as store:
        try:
            rotated = signing_keys(store).receipts.rotate(store, CLI_ACTOR)
        except ReceiptError as error:
            raise CLIError(str(error)) from None
    if args.json:
        print(json.dumps(rotated, indent=2))
    else:
        print(f"receipts are now signed with key {rotated['current']['kid']} by every replica; "
              f"{rotated['retired']['kid']} is retired and stays in the JWKS")
    return 0


def _read_text(path: str) -> str:
    try:
        return read_document(path, MAX_TEXT_BYTES, "--text").decode("utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"--text: {path} is not UTF-8 text") from None


def _json_of(data: bytes, what: str):
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise CLIError(f"{what} is not JSON") from None


def _receipt_of(data: bytes) -> str | dict:
    """The JWS of a receipt (or the legacy receipt object when it has none), from any of its wrappings."""
    stripped = data.strip()
    if stripped[:1] not in (b"{", b"["):
        return stripped.decode("ascii", "replace")
    document = _json_of(stripped, "the receipt")
    for path in (("receipt",), ("provmark", "receipt")):  # a native response, an OpenAI-style response
        inner = document
        for name in path:
            inner = inner.get(name) if isinstance(inner, dict) else None
        if isinstance(inner, dict):
            document = inner
            break
    if not isinstance(document, dict):
        raise CLIError("the receipt is neither a compact JWS nor a JSON object")
    if isinstance(document.get("jws"), str):
        return document["jws"]
    if "signature" in document and "signer_id" in document:
        return document
    raise CLIError("the JSON holds no receipt (no jws, and no legacy signature)")
