"""``provmark detect-batch``: score a file of texts on every core, or on a Ray cluster.

    provmark detect-batch IN.jsonl|IN.parquet --out OUT.jsonl|OUT.parquet [--store]
                          [--workers N | --ray [ADDRESS]] [--key ID ... | --all-keys] [--watermark SPEC]
                          [--windows] [--explain] [--model DIR] [--no-normalize] [--no-dedup]
                          [--z-threshold Z | --fpr P] [--no-progress]

Input: JSON lines (``.jsonl``, ``.ndjson``) or Parquet (``.parquet``), one record per text, the fields
``provmark detect --jsonl`` reads: ``text`` (required), ``id`` (copied to the output), ``forced_positions``;
and per record, overriding the flags: ``key`` / ``keys`` (key id or list) and ``watermark`` (spec string).
Output: one line/row per input record, in input order: ``{"id": ..., **verdict}`` exactly as
``provmark detect --jsonl`` prints it, plus ``verdict_id`` with ``--store``. In Parquet output the
nested fields (keys, windows, explanation, normalizations) are JSON text columns.

``--workers N``: local processes (default: every core). ``--ray [ADDRESS]``: Ray Data on the cluster at
ADDRESS (``auto``, ``ray://host:10001``...; without ADDRESS: RAY_ADDRESS or a new local instance);
``--workers`` then caps the actors. How keys reach the workers: see ``detector/batch.py``.
``--store``: the verdicts and their audit events go to the configured database (PROVMARK_DATABASE_URL)
in one transaction, after every text is scored: a failed run stores nothing and writes no output file.
Bad input (unreadable file, a line that is not JSON, a record without text, unknown key) exits 2 with a
message naming the record; nothing secret is ever printed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from api.cli.detect import add_scoring_options, parse_record
from api.cli.errors import CLIError
from db.store import Store, StoreError
from detector import batch, batch_store
from watermark.vocab import ModelAssetError, load_vocabulary

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
NESTED_FIELDS = ("keys", "windows", "explanation", "normalizations")  # JSON text in Parquet output


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "detect-batch", help="score a JSONL/Parquet file of texts on all cores or a Ray cluster",
        description="Score many texts; one verdict per input record, in order (exit 0 whatever the verdicts).")
    parser.add_argument("input", metavar="IN", help="records to score (.jsonl or .parquet)")
    parser.add_argument("--out", required=True, metavar="OUT", help="verdicts (.jsonl or .parquet)")
    parser.add_argument("--json", action="store_true", help="print the run's summary as JSON on stdout")
    parser.add_argument("--store", action="store_true", help="also store the verdicts in the database")
    parser.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: every core)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run on a Ray cluster (no ADDRESS: RAY_ADDRESS or a new local instance)")
    add_scoring_options(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.workers is not None and args.workers < 1:
        raise CLIError("--workers: expected a positive integer")
    in_format, out_format = _format(args.input, "IN"), _format(args.out, "--out")
    records = read_records(args.input, in_format)
    try:
        options = batch.DetectOptions(windows=args.windows, explain=args.explain, normalize=not args.no_normalize,
                                      dedup=not args.no_dedup, z_threshold=args.z_threshold, fpr=args.fpr)
        prepared = batch.prepare_jobs(records, options, keys=args.keys, spec=args.watermark,
                                      vocab=_vocabulary(args.model))
    except (batch.BatchError, ValueError) as exc:
        raise CLIError(_located(str(exc), args.input)) from None
    store = _open_store() if args.store else None
    started = time.monotonic()
    verdicts = _score(prepared, args)
    seconds = time.monotonic() - started
    rows = [({"id": r["id"]} if "id" in r else {}) | v for r, v in zip(records, verdicts)]
    temporary = _write_temporary(rows, args.out, out_format, write_now=store is None)
    try:
        if store is not None:
            ids = _store(store, prepared, verdicts)
            for row, verdict_id in zip(rows, ids):
                row["verdict_id"] = verdict_id
            _write(rows, temporary, out_format)  # again, now with the verdict ids
        os.replace(temporary, args.out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    watermarked = sum(v["verdict"] == "watermarked" for v in verdicts)
    if args.json:
        print(json.dumps({"texts": len(verdicts), "seconds": round(seconds, 3), "watermarked": watermarked,
                          "out": str(args.out), "stored": store is not None}, indent=2))
        return 0
    print(f"provmark: scored {len(verdicts)} texts in {seconds:.1f} s ({len(verdicts) / max(seconds, 1e-9):.0f}/s); "
          f"{watermarked} watermarked; wrote {args.out}" + ("; stored every verdict" if store else ""),
          file=sys.stderr)
    return 0


def _score(prepared, args) -> list[dict]:
    bar = tqdm(total=len(prepared), unit="text", desc="detect", disable=True if args.no_progress else None,
               file=sys.stderr)
    try:
        if args.ray is not None:
            from detector import batch_ray  # noqa: PLC0415 (Ray, a heavy optional dependency, loads only for --ray)

            return batch_ray.run_ray(prepared, address=args.ray or None, workers=args.workers, progress=bar.update)
        return batch.run_local(prepared, workers=args.workers, progress=bar.update)
    except batch.BatchError as exc:
        raise CLIError(_located(str(exc), args.input)) from None
    finally:
        bar.close()


def _located(message: str, path: str) -> str:
    return f"{path}: {message}"


def _format(path: str, flag: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise CLIError(f"{flag}: {path}: expected a .jsonl or .parquet file")


def _vocabulary(model: str | None):
    try:
        return load_vocabulary(model)
    except (ModelAssetError, OSError, ValueError) as exc:
        raise CLIError(f"cannot load the tokenizer: {exc}") from None


def _open_store():
    try:
        store = Store()
        store.upgrade()
    except StoreError as exc:  # carries no password
        raise CLIError(str(exc)) from None
    return store


def _store(store, prepared, verdicts) -> list[str]:
    try:
        return batch_store.store_verdicts(store, prepared, verdicts)
    except StoreError as exc:
        raise CLIError(f"nothing stored: {exc}") from None


# ------------------------------------------------------------------------------------ files


def read_records(path: str, file_format: str) -> list[dict]:
    """Every record of the input file; a malformed one stops the run with its line/row number."""
    if not os.path.isfile(path):
        raise CLIError(f"cannot read {path}: no such file")
    if file_format == "parquet":
        return _read_parquet(path)
    records = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    records.append(parse_record(line, path, number))
    except UnicodeDecodeError as exc:
        raise CLIError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    return records


def _read_parquet(path: str) -> list[dict]:
    import pyarrow as pa  # noqa: PLC0415 (pyarrow: heavy, optional, loaded for Parquet only)
    import pyarrow.parquet as pq  # noqa: PLC0415 (pyarrow: heavy, optional, loaded for Parquet only)

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise CLIError(f"cannot read {path} as Parquet: {exc}") from None
    if "text" not in table.column_names:
        raise CLIError(f'{path}: no "text" column')
    records = [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("text"), str):
            raise CLIError(f'{path}: row {number}: expected a string "text"')
    return records


def _write_temporary(rows: list[dict], out: str, file_format: str, write_now: bool) -> Path:
    """Write the output next to its destination (renamed into place only when everything succeeded)."""
    folder = Path(out).resolve().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{Path(out).name}.", suffix=".part", dir=folder)
        os.close(handle)
    except OSError as exc:
        raise CLIError(f"cannot write {out}: {exc.strerror or exc}") from None
    temporary = Path(name)
    if write_now:
        try:
            _write(rows, temporary, file_format)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    return temporary


def _write(rows: list[dict], path: Path, file_format: str) -> None:
    try:
        if file_format == "jsonl":
            with open(path, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        else:
            _write_parquet(rows, path)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa  # noqa: PLC0415 (pyarrow: heavy, optional, loaded for Parquet only)
    import pyarrow.parquet as pq  # noqa: PLC0415 (pyarrow: heavy, optional, loaded for Parquet only)

    flat = [{k: (json.dumps(v, separators=(",", ":")) if k in NESTED_FIELDS else v) for k, v in row.items()}
            for row in rows]
    if flat and "id" in flat[0]:
        try:
            pa.array([r.get("id") for r in flat])
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed id types: keep them as JSON text
            for r in flat:
                r["id"] = json.dumps(r.get("id"))
    pq.write_table(pa.Table.from_pylist(flat), path)
