"""Units common in the deployment's own texts: left out like the shipped table's (docs/detection.md).

The shipped table (``detector.common_units``) knows what the shipped human corpora share. What is left of a
fixed key's shift is what ONE collection shares and no other text knows: a code base's identifiers, a
documentation set's product name and markup, a news desk's recurring names. Under a fixed key each such unit
is one fixed coin that every text of the collection tosses the same way, so the collection's null is shifted
(measured on held-out documentation and code bases: a key-to-key spread of 0.1-0.5 in mean z).

``provmark keys calibrate --corpus PATH`` (and ``keys create --corpus``) counts, in the deployment's own texts,
the share of 200-token windows (and of text openings) that contain each unit, as the shipped table counts one
collection (``common_units.from_texts``), and stores that table here. From then on every keyed verdict of the
deployment (every key, every spec the table applies to) leaves out a unit common in either table
(``common_units.merged``): the key-free analogue of the shipped fix, for the texts the deployment judges.
Nothing of the texts is kept but hashed unit identities and their frequencies.

Storage: ``home/your-units/<tokenizer>.npz`` (the table) and ``home/your-units.json`` (per tokenizer: the
table's digest, how many texts and windows it counts), MACed with a key derived from the master key. The
table's digest is a SHA-256 of its contents, so an edited table or record is refused like a tampered
keyring, never trusted: a forged table could leave out the red units of one text and raise its z.
"""

from __future__ import annotations

import threading
from pathlib import Path

from detector.calibration import CalibrationStore
from detector.common_units import CommonUnits, merged
from watermark.key_info import KeyringIntegrityError

FOLDER = "your-units"


class YourUnitsError(KeyringIntegrityError):
    """The deployment's table of its own common units does not match its record (fail closed)."""


def scoring_table(shipped: CommonUnits | None, yours: CommonUnits | None) -> CommonUnits | None:
    """The table a verdict is scored with: none where the spec counts every position (``shipped`` is None), the
    shipped one, or the shipped one merged with the deployment's own."""
    if shipped is None or yours is None:
        return shipped
    return merged(shipped, yours)


class YourUnits:
    """The deployment's own common-unit tables, one per tokenizer: ``home/your-units/<name>.npz``, each named
    by a record in the MACed calibration file (``detector.calibration.CalibrationStore``), so the one stat a
    verdict makes for its calibrations also sees a table written since."""

    def __init__(self, keyring, store=None) -> None:
        self.store = store if store is not None else CalibrationStore(keyring)
        self.folder = Path(keyring.home) / FOLDER
        self._tables: dict[str, tuple[str, CommonUnits]] = {}  # tokenizer fingerprint -> (digest, table)
        self._lock = threading.Lock()

    def records(self) -> dict:
        """Every tokenizer's record (digest, texts, entries, file), verified."""
        return self.store.all_your_units()

    def table(self, tokenizer_fingerprint: str, fresh: bool = True) -> CommonUnits | None:
        """The table of the deployment's texts for this tokenizer, verified against its MACed digest; None if
        there is none. ``fresh=False``: the record as of the store's last ``refresh`` (the detector's, once per
        verdict). Each table is loaded once per record."""
        record = self.store.your_units(tokenizer_fingerprint, fresh)
        if record is None:
            return None
        with self._lock:
            found = self._tables.get(tokenizer_fingerprint)
            if found is not None and found[0] == record["digest"]:
                return found[1]
            path = self.folder / record["file"]
            try:
                table = CommonUnits.load(path)
            except (OSError, ValueError, KeyError) as exc:
                raise YourUnitsError(f"{path}: cannot be read ({exc.__class__.__name__})") from None
            if table.digest != record["digest"] or table.tokenizer_fingerprint != tokenizer_fingerprint:
                raise YourUnitsError(f"{path} does not match its record (edited, or another table)")
            self._tables[tokenizer_fingerprint] = (record["digest"], table)
            return table

    def put(self, table: CommonUnits, texts: int) -> dict:
        """Store ``table`` as the deployment's own for its tokenizer (replacing the previous one); its record."""
        record = {"digest": table.digest, "texts": int(texts), "entries": len(table),
                  "file": f"{table.tokenizer_fingerprint[:16]}-{table.digest}.npz"}
        self.store.refresh()  # a damaged calibration file is refused before anything is written
        self.folder.mkdir(mode=0o700, exist_ok=True)
        table.save(self.folder / record["file"])  # written before the record that names it
        previous = self.store.put_your_units(table.tokenizer_fingerprint, record)
        # the previous table stays one generation (a verdict that read its record just before may still load it);
        # older ones, and tables of this tokenizer that were forgotten, go
        keep = {record["file"]} | ({previous["file"]} if previous is not None else set())
        current = {r["file"] for r in self.store.all_your_units().values()}
        for path in self.folder.glob(f"{table.tokenizer_fingerprint[:16]}-*.npz"):
            if path.name not in keep | current:
                path.unlink(missing_ok=True)
        return record

    def forget(self, tokenizer_fingerprint: str) -> dict | None:
        """Remove this tokenizer's table (verdicts go back to the shipped table); the removed record or None. Its
        file goes at the next ``put`` (a verdict that read the record just before may still load it)."""
        return self.store.put_your_units(tokenizer_fingerprint, None)
