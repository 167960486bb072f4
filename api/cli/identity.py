"""``provmark identity``: the deployment's provenance identity (``db.identity``), made once, shown anywhere.

  provmark identity init [--json]    make it (receipt key, log key, development C2PA CA), sealed under the master
                                     key in the database; adopts this home's older key files; safe to repeat
  provmark identity show [--json]    its id and public keys (no private key is opened)

Run ``init`` once per deployment, on an admin machine that has the deployment's master key and database:
every replica then reads the same keys. A single-machine install (SQLite) needs no ``init``: its generation
service makes the identity on first start.
"""

from __future__ import annotations

import json

from api.cli.actions import add_action, usage
from api.cli.db import opened_store
from api.cli.identity_keys import describe, public_identity, signing_keys
from api.settings import Settings
from db.identity import load_identity, seal_of
from provenance.identity import PublicIdentity


def register(subparsers) -> None:
    parser = subparsers.add_parser("identity", help="make or show the deployment's provenance identity",
                                   description=__doc__.split("\n\n")[0].split(": ", 1)[1].capitalize())
    parser.set_defaults(func=lambda args: usage(parser))
    actions = parser.add_subparsers(dest="identity_action", metavar="ACTION")
    add_action(actions, "init", "make the deployment's identity once (safe to repeat)", _init).add_argument(
        "--json", action="store_true", help="machine-readable output")
    add_action(actions, "show", "print the deployment's id and public keys", _show).add_argument(
        "--json", action="store_true", help="machine-readable output")


def _init(args) -> int:
    with opened_store() as store:
        before = load_identity(store, seal_of(Settings.load().home, create=True))
        identity = signing_keys(store, create=True).identity
    return _print(identity, args.json, "exists already" if before is not None else "made")


def _show(args) -> int:
    with opened_store() as store:
        identity = public_identity(store)
    return _print(identity, args.json, None)


def _print(identity: PublicIdentity, as_json: bool, what: str | None) -> int:
    document = describe(identity)
    if as_json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"deployment {document['deployment_id']}" + (f" ({what})" if what else ""))
    print(f"log origin {document['log_origin']}")
    for key in document["keys"]:
        state = f"retired {key['retired_at']}" if key["retired_at"] else "current"
        print(f"  {key['role']:<12} {key['kid']}  {state}")
    return 0

