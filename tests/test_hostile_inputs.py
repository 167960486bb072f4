"""Hostile request bodies against both services over real sockets: what a
client sends must end in a JSON 4xx naming the problem, never a 500, never a body read past the
limit, and the same spec bounds on both services.

The sampler half of row 3 (tiny temperatures decode greedily in every path) is in
tests/test_sampling_edges.py; the serving layer (slow clients, long URLs) in tests/test_hostile_serving.py.
"""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace

import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary

from api.http import MAX_JSON_DEPTH

pytestmark = pytest.mark.slow  # the generation service loads the embedded model


@pytest.fixture(scope="module")
def services(tmp_path_factory, loaded):
    from api.detector.app import create_app as create_detector
    from api.generation.app import create_app as create_generation
    from generation.engine import Engine
    from watermark.keys import Keyring

    home = tmp_path_factory.mktemp("hostile-home")
    Keyring(home).create("k-hostile")
    engine = Engine(loaded, max_num_seqs=4, max_model_len=256)
    generation = create_generation({"home": home, "engine": engine, "rate_limit": 0, "max_text_chars": 2000})
    detector = create_detector({"home": home, "vocab": shared_vocabulary(), "rate_limit": 0, "max_text_chars": 2000})
    store = generation.extensions["provmark.store"]
    with serve(generation) as gen_url, serve(detector) as det_url:
        yield SimpleNamespace(gen=gen_url, det=det_url, token=make_token(store, "generate", "detect"))
    generation.extensions["provmark.generation"].worker.stop()


def _error(status: int, body, expected: int) -> dict:
    assert status == expected, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    return body["error"]


def _raw_post(url: str, path: str, headers: dict[str, str], body: bytes = b"", timeout: float = 10.0) -> tuple[int, dict, float]:
    """POST over a plain socket (to send a Content-Length that the body never honours); returns
    (status, JSON body, seconds to the answer)."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    elapsed = time.monotonic() - start
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload[:_length(data)] or b"null"), elapsed


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


# ---- row 2: bodies past the limit are refused from their Content-Length, before they are read ----------
@pytest.mark.parametrize("service,path", [("gen", "/v1/generate"), ("gen", "/v1/completions"),
                                          ("gen", "/v1/chat/completions"), ("det", "/v1/detect")])
def test_a_body_announced_past_the_limit_gets_a_json_413_without_being_sent(services, service, path):
    status, body, elapsed = _raw_post(getattr(services, service), path,
                                      {"Authorization": f"Bearer {services.token}", "Content-Length": str(500 << 20)})
    error = _error(status, body, 413)
    assert "too large" in error["message"].lower() or error["code"] in ("request_entity_too_large", "too_large")
    assert elapsed < 5.0  # answered from the header: the 500 MB were never sent


def test_a_large_unknown_field_is_refused_not_read_into_memory(services):
    body = {"model": "x", "prompt": "Hi", "max_tokens": 2, "user": "u" * (30 << 20)}
    status, answer, _ = call("POST", services.gen + "/v1/completions", body, token=services.token)
    _error(status, answer, 413)


# ---- row 4: deeply nested JSON is a 400, not a RecursionError ------------------------------------------
@pytest.mark.parametrize("service,path,field", [("gen", "/v1/generate", "prompt"), ("det", "/v1/detect", "text"),
                                                ("gen", "/v1/chat/completions", "messages")])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 20_000])
def test_json_nested_past_the_limit_is_a_400(services, service, path, field, depth):
    raw = ('{"%s": ' % field + "[" * depth + "]" * depth + "}").encode()
    status, body, _ = call("POST", getattr(services, service) + path, raw=raw, token=services.token,
                           headers={"Content-Type": "application/json"})
    error = _error(status, body, 400)
    assert "nest" in error["message"]


def test_nesting_inside_strings_does_not_count(services):
    status, body, _ = call("POST", services.det + "/v1/detect", {"text": "[" * 1500 + " plain words"},
                           token=services.token)
    assert status == 200, body


# ---- row 5: spec bounds and numbers past int64 are 422s with a clean message, on both services ----------
BAD_SPECS = ["kgw:delta=710", "kgw:delta=1e308", "kgw:h=99999999999999999999", "hf:hashing_key=12345678901234567890",
             "kgw:gamma=1.5", "kgw:" + "h=4," * 200]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_spec_out_of_bounds_is_a_clean_422_on_both_services(services, spec):
    answers = [call("POST", services.det + "/v1/detect", {"text": "Some words to score here.", "watermark": spec},
                    token=services.token),
               call("POST", services.gen + "/v1/generate", {"prompt": "Hi", "max_new_tokens": 2, "watermark": spec},
                    token=services.token)]
    for status, body, _ in answers:
        error = _error(status, body, 422)
        text = json.dumps(error)
        assert "long long" not in text and "Traceback" not in text and "overflow" not in text.lower(), text
        assert len(text) < 1000  # the refused value is not echoed back at length


def test_forced_positions_past_int64_is_a_422_naming_the_field(services):
    for positions in ([9223372036854775808], [-1], [10**30]):
        status, body, _ = call("POST", services.det + "/v1/detect",
                               {"text": "Some words to score here.", "forced_positions": positions}, token=services.token)
        error = _error(status, body, 422)
        assert "forced_positions" in json.dumps(error)


# ---- row 3 over HTTP: a temperature near the smallest float is greedy ------------------------------------
@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e-6])
def test_a_tiny_temperature_gives_the_greedy_answer(services, temperature):
    def generate(t, seed):
        status, body, _ = call("POST", services.gen + "/v1/generate",
                               {"prompt": "The capital of France is", "max_new_tokens": 8, "temperature": t,
                                "seed": seed, "watermark": None}, token=services.token)
        assert status == 200, body
        return body["text"]

    greedy = generate(0, 1)
    assert generate(temperature, 1) == greedy and generate(temperature, 2) == greedy
