"""The generation service with the sampling watermarks, over real HTTP: gumbel / synthid text on the native
and OpenAI-compatible routes, signed receipts naming the spec's fingerprint and key, detected by the
scoring module; greedy, vllm:gumbel and a key bound to another spec refused with a JSON 4xx."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from http_fixtures import call, make_token, serve

from api.generation.app import create_app
from db.output_memory import OutputMemory
from db.receipts import verify_receipt
from detector.scoring_sampling import positions, sampling_identities, score_text
from watermark.scheme import make_watermark

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # loads the embedded model

# whole-text exact p-value; an unwatermarked text passes it with probability 1e-4 (p is uniform under H0),
# 80 watermarked tokens at temperature 1 score far below it (test_sampling_generation_model.py)
DETECTED_P = 1e-4


@pytest.fixture(scope="module")
def live(tmp_path_factory, loaded):
    from generation.engine import Engine

    home = tmp_path_factory.mktemp("generation-sampling-home")
    engine = Engine(loaded, max_num_seqs=4, max_model_len=256)
    app = create_app({"home": home, "engine": engine, "rate_limit": 0})
    service = app.extensions["provmark.generation"]
    store = app.extensions["provmark.store"]
    keyring = service.keyring
    gumbel_key = keyring.create("gumbel-key", spec="gumbel:h=4").key_id
    synthid_key = keyring.create("synthid-key", spec="synthid:h=4").key_id
    keyring.create("vllm-key", spec="vllm:gumbel,context_width=4")
    with serve(app) as base_url:
        yield SimpleNamespace(url=base_url, service=service, keyring=keyring, gumbel_key=gumbel_key,
                              synthid_key=synthid_key, store=store, token=make_token(store, "generate"))
    service.worker.stop()


def post(live, path: str, body: dict):
    return call("POST", live.url + path, body, token=live.token)


def _score(live, spec: str, key_id: str, token_ids: list[int]) -> float:
    mark = make_watermark(spec, live.keyring.secret(key_id), live.service.vocab_size, key_id)
    return score_text(mark, token_ids).p_value


def public_key(live) -> str:
    return call("GET", live.url + "/v1/receipts/public-key")[1]["public_key_pem"]


def test_native_route_generates_detectable_gumbel_text_with_a_receipt(live):
    status, body, _ = post(live, "/v1/generate", {
        "messages": [{"role": "user", "content": "Tell me about lighthouses."}], "max_new_tokens": 80,
        "ignore_eos": True, "seed": 5, "watermark": "gumbel:h=4", "key_id": live.gumbel_key})
    assert status == 200, body
    mark = body["watermark"]
    assert mark["spec"] == "gumbel:h=4,prf=hmac-sha256,dedup=true" and mark["key_id"] == live.gumbel_key
    receipt = body["receipt"]
    assert receipt["spec_fingerprint"] == mark["fingerprint"] and receipt["key_id"] == live.gumbel_key
    assert verify_receipt(receipt, public_key(live))
    assert _score(live, "gumbel:h=4", live.gumbel_key, body["token_ids"]) < DETECTED_P
    # remembered for the detector's spoof check, under the unit identities the sampling detector counts
    units = positions(make_watermark("gumbel:h=4", live.keyring.secret(live.gumbel_key), live.service.vocab_size),
                      body["token_ids"], with_units=True)[2]
    memory = OutputMemory(live.store)
    assert memory.outputs(live.gumbel_key) >= 1
    assert memory.counts_of(live.gumbel_key, sampling_identities(units)).min() >= 1


def test_openai_chat_generates_detectable_synthid_text(live):
    status, body, _ = post(live, "/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": "Describe a storm at sea."}],
        "max_tokens": 80, "seed": 6, "watermark": "synthid:h=4", "key_id": live.synthid_key,
        "ignore_eos": True, "logprobs": True})
    assert status == 200, body
    assert body["provmark"]["watermark"]["spec"].startswith("synthid:h=4,layers=30")
    text = body["choices"][0]["message"]["content"]
    ids = live.service.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert _score(live, "synthid:h=4", live.synthid_key, ids) < DETECTED_P


@pytest.mark.parametrize("path, body", [
    ("/v1/generate", {"prompt": "Hello", "temperature": 0, "watermark": "gumbel:h=4"}),
    ("/v1/completions", {"model": "default", "prompt": "Hello", "temperature": 0, "watermark": "synthid:h=4"}),
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                              "temperature": 0, "watermark": "gumbel:h=4"}),
])
def test_greedy_with_a_sampling_watermark_is_a_400_on_every_route(live, path, body):
    key = live.gumbel_key if body["watermark"].startswith("gumbel") else live.synthid_key
    status, answer, _ = post(live, path, {**body, "key_id": key, "max_tokens" if "model" in body else "max_new_tokens": 4})
    assert status == 400, answer
    assert answer["error"]["code"] == "watermark_needs_sampling" and "greedy" in answer["error"]["message"]


def test_vllm_gumbel_is_detection_only(live):
    status, answer, _ = post(live, "/v1/generate", {"prompt": "Hello", "max_new_tokens": 4,
                                                      "watermark": "vllm:gumbel,context_width=4",
                                                      "key_id": "vllm-key"})
    assert status == 400 and "does not generate" in answer["error"]["message"]


def test_a_key_bound_to_another_spec_is_refused(live):
    status, answer, _ = post(live, "/v1/generate", {"prompt": "Hello", "max_new_tokens": 4,
                                                      "watermark": "gumbel:h=4", "key_id": live.synthid_key})
    assert status == 422, answer
    assert answer["error"]["details"][0]["field"] == "key_id" and "bound to synthid" in answer["error"]["message"]


def test_no_spec_writes_the_keys_own_and_other_colours_are_refused(live):
    """A request naming a key and no spec gets the key's own spec (gumbel here: greedy is then refused, as
    for an explicit gumbel spec); a kgw spec under that key is refused like any spec with other colours."""
    status, answer, _ = post(live, "/v1/generate", {"prompt": "Hello", "max_new_tokens": 4, "temperature": 0,
                                                      "key_id": live.gumbel_key})
    assert status == 400 and answer["error"]["code"] == "watermark_needs_sampling", answer
    status, answer, _ = post(live, "/v1/generate", {"prompt": "Hello", "max_new_tokens": 4,
                                                      "watermark": "kgw:scheme=selfhash,h=1",
                                                      "key_id": live.gumbel_key})
    assert status == 422 and answer["error"]["details"][0]["field"] == "key_id", answer
    assert f"key {live.gumbel_key} is bound to gumbel" in answer["error"]["message"]
