"""What provenance costs the services: the credentials a generation request issues, and the detector's
credential layer on texts that carry none.

1. Issuing, per finished text (``api.generation.credentials.Credentials.issue``, store included: SQLite in
   a temporary home): the peer is the receipt every request issued before C2PA and JWS (the legacy
   signature, stored with its audit event); against it, a JWS receipt with ``c2pa: off``, and with a C2PA
   manifest ``detached`` and ``embedded``. p50 and p95 in ms, and the p50 each adds to the peer.
2. A whole generation request over HTTP (``--http``, loads the embedded model): ``POST /v1/generate`` with
   ``c2pa: off`` and ``c2pa: detached`` in alternation, 16 new tokens each; p50 of each and the difference.
3. The detector's credential layer on human texts without a manifest: ``POST /v1/detect`` (Flask test
   client, one process) with the layer as served, and with it taken out (the peer), in alternating
   rounds; requests/s of each and their ratio.

    python benchmarks/provenance_cost.py [--repeats 300] [--http] [--rounds 20] [--out FILE]

Writes benchmarks/results/provenance_cost.json. Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.detector import routes_detect  # noqa: E402
from api.detector.app import create_app as create_detector  # noqa: E402
from api.generation.credentials import Credentials  # noqa: E402
from api.provenance_keys import SigningKeys  # noqa: E402
from api.settings import Settings  # noqa: E402
from benchmarks.common import percentiles, write_result  # noqa: E402
from db.receipts import SIGNED_FIELDS, ReceiptLinks, store_receipt  # noqa: E402
from db.rows import iso_utc, new_id, text_sha256, utc_now  # noqa: E402
from db.store import Store  # noqa: E402
from detector.human_corpora import HELD_OUT, documents  # noqa: E402
from watermark.keys import Keyring  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TEXT = ("The committee met on Tuesday to review the draft budget, and most members agreed that the "
        "proposed cuts to the library and the youth programmes went too far. ") * 6
MARK = SimpleNamespace(key_id="k-main", spec="kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256",
                       fingerprint="0123456789abcdef")


def issuing(home: Path, repeats: int) -> dict:
    store = Store(home=home)
    store.upgrade()
    keys = SigningKeys(Settings.load({"home": home}), store, create=True, actor="benchmark")
    signer = keys.receipts
    credentials = Credentials(store, signer, keys.c2pa, model_id="smollm2-135m-instruct",
                              links=ReceiptLinks(detector="http://127.0.0.1:8001"))
    out = SimpleNamespace(text=TEXT, token_ids=list(range(200)), watermark=MARK)

    def legacy() -> None:  # the peer: what every request issued before (legacy signature, row, audit event)
        payload = {"text_sha256": text_sha256(TEXT), "token_count": 200, "model_id": "smollm2-135m-instruct",
                   "spec_fingerprint": MARK.fingerprint, "key_id": MARK.key_id, "created_at": iso_utc(utc_now()),
                   "receipt_id": new_id()}
        store_receipt(store, {**{name: payload[name] for name in SIGNED_FIELDS}, "signature": signer.sign(payload),
                              "signer_id": signer.signer_id, "algorithm": "Ed25519"}, "bench")

    rows = {"legacy_receipt": percentiles(legacy, repeats)}
    for mode in ("off", "detached", "embedded"):
        rows[f"c2pa_{mode}"] = percentiles(lambda m=mode: credentials.issue(out, new_id(), "bench", m), repeats)
    for name, row in rows.items():
        row["added_p50_ms"] = round(row["p50_ms"] - rows["legacy_receipt"]["p50_ms"], 3)
    store.close()
    return rows


def over_http(home: Path, requests: int) -> dict:
    from api.generation.app import create_app as create_generation  # noqa: PLC0415
    from generation.engine import Engine  # noqa: PLC0415 - the model loads only with --http
    from generation.models import load_model  # noqa: PLC0415

    app = create_generation({"home": home, "engine": Engine(load_model(), max_num_seqs=4, max_model_len=256),
                             "rate_limit": 0})
    client = app.test_client()
    token = (home / "admin.token").read_text().strip()
    times = {"off": [], "detached": []}
    for i in range(requests + 2):
        for mode in times:
            start = time.perf_counter()
            answer = client.post("/v1/generate", json={"prompt": "The lighthouse keeper", "max_new_tokens": 16,
                                                       "min_new_tokens": 16, "seed": i, "c2pa": mode},
                                 headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.json
            if i >= 2:  # the first two pairs warm up
                times[mode].append((time.perf_counter() - start) * 1e3)
    app.extensions["provmark.generation"].worker.stop()
    p50 = {mode: round(statistics.median(samples), 2) for mode, samples in times.items()}
    return {"requests_each": requests, "p50_ms": p50, "added_p50_ms": round(p50["detached"] - p50["off"], 2)}


def detector_layer(home: Path, rounds: int) -> dict:
    Keyring(home).create("k-bench")
    app = create_detector({"home": home, "vocab": load_vocabulary(), "rate_limit": 0, "detect_budget": 0})
    client = app.test_client()
    token = (home / "admin.token").read_text().strip()
    texts = [d.text[:3000] for d in documents(split=HELD_OUT) if len(d.text) >= 400][:40]
    served = routes_detect.credentials_of

    def one_round() -> float:
        start = time.perf_counter()
        for text in texts:
            answer = client.post("/v1/detect", json={"text": text}, headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.json
        return len(texts) / (time.perf_counter() - start)

    one_round()  # warm-up
    with_layer, without = [], []
    for _ in range(rounds):
        with_layer.append(one_round())
        routes_detect.credentials_of = lambda services, text, manifest: None  # the peer: no credential layer
        try:
            without.append(one_round())
        finally:
            routes_detect.credentials_of = served
    rate, peer = statistics.median(with_layer), statistics.median(without)
    return {"texts_per_round": len(texts), "rounds": rounds, "requests_per_s": round(rate, 1),
            "requests_per_s_without_layer": round(peer, 1), "relative_to_peer": round(rate / peer, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--http", action="store_true", help="also time whole generation requests (loads the model)")
    parser.add_argument("--requests", type=int, default=30, help="generation requests per mode with --http")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "provenance_cost.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PROVMARK_HOME"] = folder
        result = {"issuing": issuing(Path(folder) / "issue", args.repeats),
                  "detector_layer": detector_layer(Path(folder) / "detect", args.rounds)}
        if args.http:
            result["generation_request"] = over_http(Path(folder) / "http", args.requests)
    write_result(str(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
