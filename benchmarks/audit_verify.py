"""What `provmark audit verify` costs on a long log: seconds, events/s and peak memory to verify N
events, each a ``detection`` event with its verdict row (so every event also has a row to compare).

The database is built fast but faithfully: rows and events are the documents the service writes
(``VerdictRow`` columns, ``row_digest``, ``event_hash`` chained from ``GENESIS_HASH``), inserted in bulk
into a migrated SQLite file instead of one transaction per verdict (which would take ~30 min for 1 M).

    python benchmarks/audit_verify.py [--events 1000000] [--out FILE]

Writes benchmarks/results/audit_verify.json.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result  # noqa: E402
from db.audit import GENESIS_HASH, HEAD_ROW_ID, canonical_json, event_hash, log_entry, verify  # noqa: E402
from db.audit_rows import row_digest  # noqa: E402
from db.rows import AuditEventRow, AuditHeadRow, VerdictRow, iso_utc  # noqa: E402
from db.store import Store  # noqa: E402
from provenance.merkle import leaf_hash  # noqa: E402

CHUNK = 20_000
SPEC = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256"


def build(store: Store, n: int) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    previous, seq = GENESIS_HASH, 0
    with tqdm(total=n, desc="writing events", unit="ev") as bar:
        while seq < n:
            verdicts, events = [], []
            for _ in range(min(CHUNK, n - seq)):
                seq += 1
                at = start + timedelta(milliseconds=seq)
                row = VerdictRow(id=f"v-{seq:09d}", created_at=at, text_sha256=f"{seq:064x}",
                                 verdict="not_watermarked", z=(seq % 97) / 50 - 1, p_value=0.5, green_count=25,
                                 scored_count=100, green_fraction=0.25, spec=SPEC, spec_fingerprint="f" * 16,
                                 tokenizer_fingerprint="t" * 16, key_id="k-bench", options={"z_threshold": 4.0},
                                 windows=None, receipt_id=None, caller_token_id=None, caller_name="bench", text=None)
                details = {"verdict": row.verdict, "z": row.z, "key_id": row.key_id,
                           "spec_fingerprint": row.spec_fingerprint, "row_sha256": row_digest(row)}
                event_id = f"e-{seq:09d}"
                digest = event_hash(previous, event_id, "detection", "bench", row.id, iso_utc(at), details)
                entry = log_entry(seq, event_id, "detection", row.id, iso_utc(at), details, digest)
                verdicts.append({c.name: getattr(row, c.name) for c in VerdictRow.__table__.columns})
                events.append({"seq": seq, "event_id": event_id, "kind": "detection", "actor": "bench",
                               "subject_id": row.id, "created_at": at, "details": canonical_json(details).decode(),
                               "prev_hash": previous, "hash": digest, "leaf_hash": leaf_hash(entry).hex()})
                previous = digest
            with store.write() as session:
                session.execute(VerdictRow.__table__.insert(), verdicts)
                session.execute(AuditEventRow.__table__.insert(), events)
                head = session.get(AuditHeadRow, HEAD_ROW_ID)
                head.seq, head.hash = seq, previous
            bar.update(len(events))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "audit_verify.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        store = Store(url=f"sqlite:///{folder}/bench.db")
        store.upgrade()
        started = time.perf_counter()
        build(store, args.events)
        built = time.perf_counter() - started
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        report = verify(store)
        seconds = time.perf_counter() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        size = Path(folder, "bench.db").stat().st_size
        store.close()
    assert report.ok and report.events == args.events and report.rows_checked == args.events, report.problems[:3]
    result = {"events": args.events, "verify_seconds": round(seconds, 2), "events_per_second": round(args.events / seconds),
              "build_seconds": round(built, 1), "database_mb": round(size / 2**20, 1),
              "peak_rss_mb_before_verify": round(rss_before / 1024), "peak_rss_mb_after_verify": round(rss_after / 1024),
              "backend": "sqlite", "python": sys.version.split()[0]}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
