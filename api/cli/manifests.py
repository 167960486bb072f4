"""``provmark manifests``: the C2PA manifests of generated texts, fetched and checked from the command line.

  provmark manifests get ID --out FILE          a stored manifest store (.c2pa), by manifest id
  provmark manifests check TEXT [--manifest FILE] [--trust-anchors PEM] [--json]
        the Content Credentials of a text file: embedded in it (C2PA 2.4 Annex A.8) or in a .c2pa file
        beside it; trusted under PEM roots: the service's (GET /v1/c2pa/trust-anchors, saved to a file); on
        a machine of the deployment, the default is the roots its detector trusts.
        Exit 0: valid and trusted; 1: not (the report says why); 2: bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

from api.cli.actions import add_action, usage
from api.cli.db import opened_store
from api.cli.documents import read_document
from api.cli.errors import CLIError
from api.cli.identity_keys import public_identity
from api.settings import Settings
from db.manifests import get_manifest
from db.store import SQLITE_FILE
from provenance.c2pa_credential import C2paCredentialError, configured_trust_anchors
from provenance.c2pa_reading import read_credentials
from provenance.identity import IdentityError

MAX_FILE_BYTES = 16 << 20  # a manifest store is a few KB, a text far less than this


def register(subparsers) -> None:
    parser = subparsers.add_parser("manifests", help="fetch and check the C2PA manifests of generated texts",
                                   description="Fetch and check the C2PA manifests of generated texts.")
    parser.set_defaults(func=lambda args: usage(parser))
    actions = parser.add_subparsers(dest="manifests_action", metavar="ACTION")
    get = add_action(actions, "get", "write a stored manifest store (.c2pa) to a file", _get)
    get.add_argument("manifest_id", metavar="ID", help="the manifest id (urn:c2pa:...), as a generation answered it")
    get.add_argument("--out", required=True, type=Path, metavar="FILE", help="where to write the .c2pa file")
    get.add_argument("--json", action="store_true", help="machine-readable output")
    check = add_action(actions, "check", "check the Content Credentials of a text file", _check)
    check.add_argument("text", type=Path, metavar="TEXT", help="the text file, exactly as delivered (UTF-8)")
    check.add_argument("--manifest", type=Path, metavar="FILE", help="its detached manifest store (.c2pa); "
                                                                    "without it, the manifest embedded in the text")
    check.add_argument("--trust-anchors", type=Path, metavar="PEM",
                       help="PEM roots to trust, e.g. saved from the service's /v1/c2pa/trust-anchors (default, on "
                            "a machine of the deployment: PROVMARK_C2PA_TRUST_ANCHORS, else its development root)")
    check.add_argument("--json", action="store_true", help="machine-readable output")


def _get(args) -> int:
    with opened_store() as store:
        record = get_manifest(store, args.manifest_id)
        if record is None:
            raise CLIError(f"no manifest {args.manifest_id!r} in {store.safe_url}")
    try:
        args.out.write_bytes(record.manifest_store)
    except OSError as error:
        raise CLIError(f"cannot write {args.out}: {error.strerror or error}") from None
    if args.json:
        print(json.dumps({"manifest_id": record.manifest_id, "receipt_id": record.receipt_id, "out": str(args.out),
                          "bytes": len(record.manifest_store), "embedded": record.embedded}, indent=2))
        return 0
    print(f"wrote {args.out} ({len(record.manifest_store)} bytes): the manifest of receipt {record.receipt_id}")
    return 0


def _check(args) -> int:
    try:
        text = _read(args.text).decode("utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"{args.text} is not UTF-8 text") from None
    manifest = _read(args.manifest) if args.manifest is not None else None
    anchors = (_read(args.trust_anchors).decode("ascii", "replace") if args.trust_anchors is not None
               else _deployment_anchors())
    report = read_credentials(text, manifest, anchors)
    if report is None:
        raise CLIError(f"{args.text} carries no C2PA manifest: give its .c2pa file with --manifest")
    ok = report.valid and report.trusted
    if args.json:
        print(json.dumps({"ok": ok, **report.to_dict()}, indent=2))
    elif ok:
        print(f"Trusted: manifest {report.manifest_id} ({report.source}) signed under a trusted root, and the text "
              f"is exactly the one signed" + (f"; model {report.model_id}" if report.model_id else ""))
    else:
        reasons = report.problem or ", ".join(report.failures) or report.validation_state
        print(f"{report.validation_state}: manifest {report.manifest_id or '-'} ({report.source}): {reasons}")
    return 0 if ok else 1


def _deployment_anchors() -> str:
    """The roots this machine's deployment trusts; never made here (an outsider names them instead)."""
    settings = Settings.load()
    try:
        configured = configured_trust_anchors(settings.c2pa())
    except (C2paCredentialError, ValueError) as error:
        raise CLIError(str(error)) from None
    if configured is not None:
        return configured
    if settings.database_url is None and not (settings.home / SQLITE_FILE).exists():
        raise CLIError("give --trust-anchors PEM: the roots the issuing service publishes at "
                       "/v1/c2pa/trust-anchors (this machine holds no deployment to take them from)")
    with opened_store() as store:
        try:
            return public_identity(store).trust_anchor_pem()
        except IdentityError as error:
            raise CLIError(str(error)) from None


def _read(path: Path) -> bytes:
    return read_document(str(path), MAX_FILE_BYTES, str(path))
