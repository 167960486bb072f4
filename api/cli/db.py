"""``provmark db``, ``provmark audit`` and ``provmark tokens``: the store from the command line.

  provmark db upgrade                         apply schema migrations (idempotent)
  provmark audit verify [--json]              check the audit hash chain; exit 1 if it was tampered with
  provmark audit head | prove | check-proof | log-key    the transparency log (api/cli/audit_log.py)
  provmark tokens create --scopes S [--name N] print a new API token once (only its hash is stored)
  provmark tokens list [--json]               token ids, names, scopes, times (never tokens)
  provmark tokens revoke ID                   revoke a token for good

The database is ``PROVMARK_DATABASE_URL`` or SQLite at ``$PROVMARK_HOME/provmark.db``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator

from api.cli import audit_log
from api.cli.actions import add_action, usage
from api.cli.errors import CLIError
from api.cli.identity_keys import optional_log_key
from db.api_tokens import SCOPES, TokenError, create_token, list_tokens, revoke_token
from db.audit import HEAD_ROW_ID, verify
from db.rows import AuditHeadRow
from db.store import Store, StoreError

CLI_ACTOR = "cli"
TOKEN_COLUMNS = ("TOKEN ID", "NAME", "SCOPES", "CREATED (UTC)", "REVOKED (UTC)")


def register(subparsers) -> None:
    db = _group(subparsers, "db", "manage the detector database")
    _action(db, "upgrade", "apply pending schema migrations (safe to repeat)", _db_upgrade).add_argument(
        "--json", action="store_true", help="machine-readable output")

    audit = _group(subparsers, "audit", "inspect the audit log and its transparency log")
    _action(audit, "verify", "check the audit hash chain, and the verdict and receipt rows against it",
            _audit_verify).add_argument("--json", action="store_true", help="machine-readable output")
    audit_log.register(audit, _action)

    tokens = _group(subparsers, "tokens", "manage API tokens")
    create = _action(tokens, "create", "create an API token (printed once, stored hashed)", _tokens_create)
    create.add_argument("--scopes", nargs="+", required=True, metavar="SCOPE",
                        help=f"one or more of {', '.join(SCOPES)} (space or comma separated)")
    create.add_argument("--name", default="cli", help="a label for people (default: cli)")
    create.add_argument("--json", action="store_true", help="machine-readable output")
    _action(tokens, "list", "list API tokens (never the tokens themselves)", _tokens_list).add_argument(
        "--json", action="store_true", help="machine-readable output")
    revoke = _action(tokens, "revoke", "revoke an API token for good", _tokens_revoke)
    revoke.add_argument("token_id", metavar="ID")
    revoke.add_argument("--json", action="store_true", help="machine-readable output")


def _group(subparsers, name: str, help_text: str):
    description = help_text[0].upper() + help_text[1:] + "."
    parser = subparsers.add_parser(name, help=help_text, description=description)
    parser.set_defaults(func=lambda args: usage(parser))
    return parser.add_subparsers(dest=f"{name}_action", metavar="ACTION")


def _action(actions, name: str, help_text: str, handler) -> argparse.ArgumentParser:
    parser = add_action(actions, name, help_text, lambda args: _run(handler, args))
    return parser


@contextlib.contextmanager
def opened_store() -> Iterator[Store]:
    """The CLI's store (``PROVMARK_DATABASE_URL`` or SQLite in ``PROVMARK_HOME``), migrated, closed after; its
    errors (which never carry passwords) become CLIErrors."""
    store = None
    try:
        store = Store()
        store.upgrade()
        yield store
    except StoreError as error:
        raise CLIError(str(error)) from None
    finally:
        if store is not None:
            store.close()


def _run(handler, args) -> int:
    store = None
    try:
        store = Store()
        return handler(store, args)
    except (StoreError, TokenError) as exc:  # neither carries secrets or passwords
        raise CLIError(str(exc)) from None
    finally:
        if store is not None:
            store.close()


def _db_upgrade(store: Store, args) -> int:
    revision = store.upgrade()
    if args.json:
        print(json.dumps({"database": store.safe_url, "revision": revision}, indent=2))
        return 0
    print(f"database {store.safe_url} is at revision {revision}")
    return 0


def _audit_verify(store: Store, args) -> int:
    store.upgrade()  # a fresh database verifies as an empty chain
    from tqdm import tqdm

    with store.read() as session:
        head = session.get(AuditHeadRow, HEAD_ROW_ID)
        steps = 3 * (head.seq if head is not None else 0)
    # on a terminal only (tqdm's disable=None); --json output stays clean either way (the bar is on stderr)
    with tqdm(total=steps, desc="verifying audit log", unit="ev", disable=None, leave=False) as bar:
        report = verify(store, progress=bar.update, log_key=optional_log_key(store))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.ok:
        print(f"audit chain OK: {report.events} events, head {report.head_hash}; {report.rows_checked} verdict and "
              f"receipt rows match their events" + (f" ({report.rows_partly_covered} written before row digests: "
                                                   "only the fields their events carried were compared)"
                                                   if report.rows_partly_covered else "")
              + (f"; {report.tree_heads_checked} signed tree heads match the events" if report.tree_heads_checked
                 else ""))
    else:
        print(f"audit chain BROKEN: {len(report.problems)} problem(s) in {report.events} events")
        for problem in report.problems:
            print(f"  [{problem.problem}] {problem.message}")
    return 0 if report.ok else 1


def _tokens_create(store: Store, args) -> int:
    store.upgrade()
    token_id, plaintext = create_token(store, ",".join(args.scopes), args.name, actor=CLI_ACTOR)
    if args.json:
        print(json.dumps({"token_id": token_id, "token": plaintext}, indent=2))
        return 0
    print(f"created token {token_id}; it is shown only this once:")
    print(plaintext)
    return 0


def _tokens_list(store: Store, args) -> int:
    store.upgrade()
    infos = list_tokens(store)
    if args.json:
        print(json.dumps([info.to_dict() for info in infos], indent=2))
        return 0
    if not infos:
        print("no API tokens yet: create one with `provmark tokens create --scopes detect`")
        return 0
    rows = [TOKEN_COLUMNS] + [
        (i.token_id, i.name, ",".join(sorted(i.scopes)), i.created_at, i.revoked_at or "-") for i in infos
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(TOKEN_COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _tokens_revoke(store: Store, args) -> int:
    store.upgrade()
    info = revoke_token(store, args.token_id, actor=CLI_ACTOR)
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    print(f"token {info.token_id} ({info.name}) is revoked since {info.revoked_at}")
    return 0
