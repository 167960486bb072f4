"""The generation service remembers what it wrote under each key, for the detector's spoof check (#17).

A watermark thief learns colours from the service's output, so the units it knows are the units that
recur there; ``detector.spoof_check`` asks whether a positive text's greens sit on those. For that the
detector needs, per key, in how many outputs each unit occurred and a null of the service's own outputs.
Both are written here, when an output's receipt is issued, into the shared store (``db.output_memory``).
"""

from __future__ import annotations

import logging

import torch

from db.output_memory import OutputMemory
from db.store import Store, StoreError
from detector import common_units
from detector.spoof_check import output_null_z

log = logging.getLogger(__name__)


class OwnOutput:
    """``remember`` each watermarked output of a keyring key (KGW specs: the check is KGW's)."""

    def __init__(self, store: Store) -> None:
        self.memory = OutputMemory(store)

    def remember(self, mark, token_ids: list[int], vocab) -> None:
        """The output's spoof z against what the key wrote before (a null sample) and its units' counts.
        Never fails the generation: a store error is logged and the output is left out of the memory."""
        if mark is None or mark.key_id is None or getattr(mark.spec, "kind", None) != "kgw":
            return
        ids = torch.as_tensor(token_ids, dtype=torch.int64)
        try:
            z = output_null_z(mark, ids, common_units.for_spec(mark.spec, vocab), self.memory)
            self.memory.record(mark.key_id, mark.unit_identities(ids), z)
        except StoreError as exc:
            log.warning("output not remembered for the spoof check: %s", exc)
