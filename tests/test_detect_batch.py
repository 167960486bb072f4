"""``provmark detect-batch`` and ``detector.batch``: verdicts equal ``provmark detect``'s, on local
processes and on a local Ray cluster; JSONL and Parquet; --store all or nothing; clear input errors."""

import hashlib
import json
import math
import shutil
import tempfile

import pytest
from http_fixtures import human_text, shared_vocabulary, watermarked_text

from api.cli import main
from db.rows import AuditEventRow, VerdictRow
from db.store import Store
from detector import batch, batch_secrets
from detector.scoring_request import DetectOptions
from detector.service import Detector
from watermark.key_info import KeyringError
from watermark.keys import Keyring

HF_SPEC = "hf:greenlist_ratio=0.25"


@pytest.fixture
def keyring(provmark_home):
    """"alpha" (active) and "beta" with fixed secrets: the records below, and the margin of the one with forced
    positions, are the same in every run (with fresh random keys that margin was left to chance)."""
    ring = Keyring()
    for key_id in ("alpha", "beta"):
        ring.create(key_id, secret=hashlib.sha256(b"provmark-test/detect-batch/" + key_id.encode()).digest())
    return ring


@pytest.fixture(scope="module")
def sources():
    return [human_text(700, start) for start in (0, 900, 1800, 2700, 3600)]


@pytest.fixture
def records(keyring, sources):
    """Watermarked (alpha / beta), human, empty and forced-position texts, some with ids."""
    vocab = shared_vocabulary()
    # 200 tokens: with 40 of them forced, the rest still carries z >= 6 for each of 70 random keys tried (these
    # two fixed keys: z 9.4 of 81 scored)
    marked = [watermarked_text(vocab, keyring.secret(k), s, max_tokens=200) for k, s in zip(("alpha", "beta"), sources)]
    out = [{"id": "m-alpha", "text": marked[0]}, {"id": 7, "text": sources[2]}, {"text": marked[1]},
           {"id": "empty", "text": ""}, {"id": "forced", "text": marked[0], "forced_positions": list(range(40))}]
    return out + [{"id": f"h{i}", "text": sources[i % 5][i:]} for i in range(11)]


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def cli(capsys, *argv):
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def detect_jsonl(capsys, path) -> list[str]:
    code, out, err = cli(capsys, "detect", "--jsonl", path)
    assert code == 0, err
    return out.splitlines()


def test_local_pool_verdicts_equal_provmark_detect(capsys, tmp_path, records, keyring, monkeypatch):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, records)
    monkeypatch.setattr(batch, "CHUNK_ROWS", 4)  # several chunks: the spawned pool really runs
    code, out, err = cli(capsys, "detect-batch", source, "--out", tmp_path / "out.jsonl", "--workers", "2",
                         "--no-progress")
    assert code == 0, err
    got = (tmp_path / "out.jsonl").read_text().splitlines()
    assert got == detect_jsonl(capsys, source)  # byte for byte, in input order
    verdicts = [json.loads(line) for line in got]
    assert [v["verdict"] for v in verdicts[:5]] == ["watermarked", "not_watermarked", "watermarked",
                                                   "insufficient_text", "watermarked"]
    assert verdicts[4]["num_forced_positions"] > 0
    for key_id in ("alpha", "beta"):
        assert keyring.secret(key_id).hex() not in out + err + "".join(got)
    assert "16 texts" in err and out == ""


def test_per_record_key_and_spec_and_parquet_round_trip(capsys, tmp_path, records, keyring):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"id": "a", "text": records[0]["text"], "key": "beta"},
            {"id": "b", "text": records[0]["text"], "keys": ["alpha"], "forced_positions": [3, 4]},
            {"id": "c", "text": records[1]["text"], "watermark": HF_SPEC}]
    columns = ("id", "text", "key", "keys", "forced_positions", "watermark")  # absent -> null
    pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), tmp_path / "in.parquet")
    code, _, err = cli(capsys, "detect-batch", tmp_path / "in.parquet", "--out", tmp_path / "out.parquet",
                       "--windows", "--no-progress")
    assert code == 0, err
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    detector = Detector(vocab=shared_vocabulary())
    expected = [detector.detect(rows[0]["text"], keys=["beta"], options=DetectOptions(windows=True)),
                detector.detect(rows[1]["text"], keys=["alpha"], options=DetectOptions(windows=True, forced_positions=[3, 4])),
                detector.detect(rows[2]["text"], spec=HF_SPEC, options=DetectOptions(windows=True))]
    assert [r["id"] for r in out] == ["a", "b", "c"]
    for row, verdict in zip(out, expected):
        want = verdict.to_dict()
        assert json.loads(row["keys"]) == want["keys"] and json.loads(row["windows"]) == want["windows"]
        assert (row["verdict"], row["key_id"], row["watermark"]) == (want["verdict"], want["key_id"], want["watermark"])
        assert row["z_score"] == want["z_score"] or (row["z_score"] is None and want["z_score"] is None)
    assert out[0]["verdict"] == "not_watermarked" and out[1]["verdict"] == "watermarked"


def test_store_writes_every_verdict_with_its_audit_event(capsys, tmp_path, records, keyring):
    from db.audit import verify

    source = tmp_path / "in.jsonl"
    write_jsonl(source, records[:6])
    code, _, err = cli(capsys, "detect-batch", source, "--out", tmp_path / "out.jsonl", "--store", "--no-progress")
    assert code == 0, err
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    store = Store()
    with store.read() as session:
        rows = {r.id: r for r in session.query(VerdictRow)}
        events = session.query(AuditEventRow).filter(AuditEventRow.kind == "detection").count()
    assert len(rows) == events == 6 and {o["verdict_id"] for o in out} == set(rows)
    for o in out:
        row = rows[o["verdict_id"]]
        assert (row.verdict, row.text_sha256, row.key_id) == (o["verdict"], o["text_sha256"], o["key_id"])
        assert row.text is None and row.options["source"] == "batch"
    assert verify(store).ok
    store.close()


def test_stored_batch_verdicts_record_the_detect_scope_view_the_service_shows(capsys, tmp_path, records, keyring):
    """An ``audit`` token alone reads each row's detect-scope view (db.verdicts): a batch row records the same view
    the detector service would show a ``detect`` caller for that text (its dither key derives from the same
    master key), so it is not ``withheld``."""
    source = tmp_path / "in.jsonl"
    write_jsonl(source, records[:6])
    code, _, err = cli(capsys, "detect-batch", source, "--out", tmp_path / "out.jsonl", "--store", "--no-progress",
                       "--windows")
    assert code == 0, err
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all("disclosed" not in o for o in out)  # the output file keeps the verdicts as `provmark detect` writes them
    store, service = Store(), Detector(keyring=keyring)
    for record, o in zip(records[:6], out):
        seen = store.get_verdict(o["verdict_id"], exact=False)
        shown = service.detect(record["text"], options=DetectOptions(
            windows=True, forced_positions=record.get("forced_positions"))).disclose("detect")
        assert seen["disclosure"] == "coarse-dithered/v1", seen
        assert (seen["verdict"], seen["z"], seen["p_value"], seen["key_id"], seen["windows"]) == \
            (shown["verdict"], shown["z_score"], shown["p_value"], shown["key_id"], shown["windows"])
    assert any(o["verdict"] == "watermarked" for o in out) and any(o["verdict"] == "not_watermarked" for o in out)
    store.close()


def stored_count() -> int:
    store = Store()
    store.upgrade()
    with store.read() as session:
        count = session.query(VerdictRow).count()
    store.close()
    return count


@pytest.mark.parametrize("lines, message", [
    (None, "no such file"),
    (['{"text": "fine"}', '{"text": oops}'], "in.jsonl:2: not a JSON object"),
    (['{"text": "fine"}', '{"id": 3}'], 'in.jsonl:2: expected an object with a string "text" field'),
    (['{"text": "fine"}', '{"text": "x", "key": "nobody"}'], "nobody"),
    (['{"text": "fine"}', '{"text": "x", "forced_positions": [-1]}'], "record 2: forced_positions"),
    (['{"text": "fine"}', '{"text": "lone \\ud800 surrogate"}'], "record 2: ValueError"),
])
def test_bad_input_exits_2_and_writes_nothing(capsys, tmp_path, keyring, lines, message):
    source = tmp_path / "in.jsonl"
    if lines is not None:
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = stored_count()
    code, _, err = cli(capsys, "detect-batch", source, "--out", tmp_path / "out.jsonl", "--store",
                         "--no-progress", "--workers", "1")
    assert code == 2 and message in err and err.startswith("provmark: "), err
    assert not list(tmp_path.glob("out.jsonl*")) and not list(tmp_path.glob(".out.jsonl*"))
    assert stored_count() == before


def test_key_secrets_never_show_in_reprs(keyring):
    secrets = batch_secrets.KeySecrets({"alpha": keyring.secret("alpha")})
    prepared = batch.prepare_jobs([{"text": "hello there"}], batch.DetectOptions(), vocab=shared_vocabulary())
    for shown in (repr(secrets), str(secrets), repr(prepared), repr(batch_secrets.SecretsKeyring(secrets))):
        assert keyring.secret("alpha").hex() not in shown and "alpha" in repr(secrets)
    assert prepared.jobs[0].keys == ("alpha", "beta")  # every detection key, in keyring order


def test_sealed_secrets_open_only_with_their_transport_key(keyring):
    secrets = batch_secrets.KeySecrets({"alpha": keyring.secret("alpha")})
    sealed, key = batch_secrets.seal_secrets(secrets)
    assert keyring.secret("alpha") not in sealed and keyring.secret("alpha").hex().encode() not in sealed
    assert batch_secrets.open_secrets(sealed, key).secret("alpha") == keyring.secret("alpha")
    _, other_key = batch_secrets.seal_secrets(secrets)
    with pytest.raises(KeyringError, match="does not open"):
        batch_secrets.open_secrets(sealed, other_key)


def test_evaluation_scorer_batch_backend_matches_inline(keyring, records):
    from evaluation.scorer import Scorer
    from watermark.config import WatermarkSpec

    texts = [r["text"] for r in records[:6]]
    spec = WatermarkSpec.default()
    inline = Scorer(shared_vocabulary(), keyring, null_keys=1, seed=0)
    local = Scorer(shared_vocabulary(), keyring, null_keys=1, seed=0, detect_backend="local", workers=1)
    try:
        a, b = inline.score(texts, spec, "alpha", prefixes=True), local.score(texts, spec, "alpha", prefixes=True)
        def same(x, y) -> bool:
            return x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))

        assert all(same(r["z"], s["z"]) and r["detected"] == s["detected"] and r["p_value"] == s["p_value"]
                   and r["prefix"].tolist() == s["prefix"].tolist() for r, s in zip(a, b))
        assert inline.last_alpha == local.last_alpha
    finally:
        inline.close()
        local.close()
    with pytest.raises(ValueError, match="detect_backend"):
        Scorer(shared_vocabulary(), keyring, 0, 0, detect_backend="spark")


@pytest.mark.slow  # starts a local Ray cluster (2 CPUs)
def test_ray_cluster_verdicts_equal_provmark_detect(capsys, tmp_path, records, keyring):
    ray = pytest.importorskip("ray")
    source = tmp_path / "in.jsonl"
    write_jsonl(source, records)
    ray_dir = tempfile.mkdtemp(prefix="pm-ray-")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, _temp_dir=ray_dir,
             logging_level="WARNING", log_to_driver=False)
    try:
        code, _, err = cli(capsys, "detect-batch", source, "--out", tmp_path / "out.jsonl", "--ray",
                             "--no-progress")
        assert code == 0, err
        got = (tmp_path / "out.jsonl").read_text().splitlines()
        assert got == detect_jsonl(capsys, source)
        bad = tmp_path / "bad.jsonl"
        write_jsonl(bad, [{"text": "fine"}, {"text": "lone \ud800"}])
        code, _, err = cli(capsys, "detect-batch", bad, "--out", tmp_path / "bad-out.jsonl", "--ray", "--no-progress")
        assert code == 2 and "record 2" in err and not (tmp_path / "bad-out.jsonl").exists()
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
