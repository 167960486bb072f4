"""How ``provmark keys`` shows keys and calibrations: JSON for programs, a fixed-width table and sentences for
people. Only public facts: ids, statuses, fingerprints, specs, times and calibration summaries."""

from __future__ import annotations

import json
import sys

from detector import calibration
from detector.calibration import CalibrationStore
from detector.common_units import current_digests
from detector.your_units import YourUnits
from watermark.key_binding import bound_spec
from watermark.key_info import KeyInfo, KeyringError
from watermark.keys import Keyring

COLUMNS = ("KEY ID", "STATUS", "FINGERPRINT", "CREATED (UTC)", "RETIRED (UTC)", "SPEC")


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2))


def describe_calibration(summary: dict) -> str:
    """One sentence for a calibration summary: its worst shift and guarded false-positive rate, screening."""
    factor = summary["worst_guarded_fpr"] / summary["stated_fpr"]
    state = "passes screening" if summary["passes_screen"] else "FAILS screening"
    worst = summary["max_abs_mean_z"]
    worst = "-" if worst is None else f"{worst:.3f}"
    return (f"calibration {summary['id']} ({summary['spec']}): max |mean z| {worst} over length buckets; "
            f"false-positive rate at most {factor:.2f}x the stated {summary['stated_fpr']:.2g}; {state}"
            + (f"; with {summary['your_texts']} texts of yours" if "your_texts" in summary else ""))


def calibration_column(keyring: Keyring) -> dict[str, list[dict]]:
    """key id -> summaries of its calibrations, each marked ``stale`` when the detector would not use it (an
    unreadable calibration file is said, not fatal)."""
    store = CalibrationStore(keyring)
    out = {}
    try:
        current = current_digests(YourUnits(keyring))
        for info in keyring.list():
            out[info.key_id] = [{**c.summary(), "stale": calibration.is_stale(c, current)}
                                for c in store.for_key(info.key_id)]
    except KeyringError as exc:  # an unreadable calibration file or table of your texts' units
        print(f"warning: {exc}", file=sys.stderr)
    return out


def format_table(infos: list[KeyInfo], calibrations: dict[str, list[dict]] | None = None) -> str:
    """A fixed-width table of public key facts (and, given, each key's calibration under its own spec)."""
    columns = COLUMNS + (("CALIBRATION (own spec)",) if calibrations is not None else ())
    rows = [columns] + [
        (
            info.key_id,
            info.status + (" (purged)" if info.purged else ""),
            info.fingerprint,
            info.created_at,
            info.retired_at or "-",
            bound_spec(info).format() + (" (two-part)" if info.public_half else ""),
        ) + ((_calibration_cell(info, calibrations.get(info.key_id, [])),) if calibrations is not None else ())
        for info in infos
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _calibration_cell(info: KeyInfo, summaries: list[dict]) -> str:
    own = bound_spec(info).format()
    found = next((c for c in summaries if c["spec"] == own), None)
    if found is None:
        return "none (provmark keys calibrate)"
    if found.get("stale"):
        return f"{found['id']} stale: made under another common-unit table, not used (provmark keys calibrate)"
    factor = found["worst_guarded_fpr"] / found["stated_fpr"]
    worst = "-" if found["max_abs_mean_z"] is None else f"{found['max_abs_mean_z']:.2f}"
    return f"{found['id']} max|mean z| {worst}, FPR <= {factor:.1f}x stated"
