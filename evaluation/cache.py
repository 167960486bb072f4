"""An append-only JSON-lines cache on disk: what an evaluation run already computed, so a later
run (after an interruption, or with more attacks) resumes instead of redoing it.

One record per line, ``{"key": ..., "value": ...}``; the last record of a key wins. A torn last line
(the process was killed mid-write) is ignored on reading. Keys are SHA-256 digests of everything
that determines the value, so a changed setting is a cache miss, never a stale hit. Values hold
texts and token ids, never secrets (keys enter only through their public fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_key(**parts) -> str:
    """SHA-256 of the canonical JSON of ``parts``."""
    material = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class JsonlCache:
    """``JsonlCache(path)``: ``get(key)``, ``put_many({key: value})`` (appended and flushed at once)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._values: dict[str, object] = {}
        if self.path.exists():
            with self.path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                        self._values[record["key"]] = record["value"]
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn write at the end: that value is simply recomputed

    def __repr__(self) -> str:
        return f"JsonlCache({str(self.path)!r}, entries={len(self._values)})"

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: str, default=None):
        return self._values.get(key, default)

    def put_many(self, items: dict[str, object]) -> None:
        if not items:
            return
        lines = "".join(json.dumps({"key": k, "value": v}, ensure_ascii=False) + "\n" for k, v in items.items())
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())
        self._values.update(items)
