"""``provmark keys``: create, list, rotate, calibrate, export and retire watermark keys; one module per action.

Output is a table for people or, with ``--json``, JSON for programs (one object per key; ``list``
prints an array). Only public facts are shown: id, status, fingerprint, spec, times and calibrations,
never a secret. A key is bound to one spec (``--spec``: kgw, gumbel:, synthid: or vllm:gumbel) and
screened and calibrated under it; ``keys list`` marks a calibration ``stale`` when it was measured under
a common-unit table the detector no longer uses (the detector then ignores it: calibrate again).
The keyring lives in ``$PROVMARK_HOME``; its master key comes from ``PROVMARK_MASTER_KEY`` or
``$PROVMARK_HOME/master.key`` (see ``watermark.keys``). Every action that changes a key records a
``key.<action>`` audit event (``api.cli.keys.audit``).
"""

from __future__ import annotations

from api.cli.actions import add_action, usage
from api.cli.errors import CLIError
from api.cli.keys import calibrate, create, export_public, list_keys, retire, rotate
from api.cli.keys.audit import record_key_events
from detector.calibration import CalibrationStoreError
from watermark.key_info import KeyringError
from watermark.keys import Keyring

ACTIONS = (create, list_keys, rotate, calibrate, export_public, retire)  # in help order


def register(subparsers) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="manage watermark keys",
        description="Manage watermark keys (stored encrypted in $PROVMARK_HOME/keyring.json).",
    )
    keys.set_defaults(func=lambda args: usage(keys))
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION")
    for action in ACTIONS:
        parser = add_action(actions, action.NAME, action.HELP, lambda args, run=action.run: _run(run, args))
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        action.add_arguments(parser)


def _run(action_run, args) -> int:
    try:
        events = action_run(Keyring(), args) or []
    except (KeyringError, CalibrationStoreError) as exc:  # these messages never carry secrets
        raise CLIError(str(exc)) from None
    record_key_events(events)
    return 0
