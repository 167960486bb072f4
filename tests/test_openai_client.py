"""The official `openai` Python client, unchanged, against the generation service on a real socket:
completions, chat, streaming both; what it gets back is detected as watermarked, and the receipt
in the ``provmark`` field verifies offline with the service's public key."""

import json
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import c2pa_unstructured_text
import openai
import pytest
from conftest import FIXED_SECRET
from http_fixtures import call, make_token, serve

from api.cli.main import main
from api.generation.app import create_app
from db.receipts import verify_receipt
from db.rows import text_sha256
from detector.service import Detector
from watermark.keys import Keyring
from watermark.stats import Z_THRESHOLD

pytestmark = pytest.mark.slow  # loads the embedded model
ROOT = Path(__file__).resolve().parent.parent
STORY_PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
STORY_SEED = 1  # fixed: the same request gives the same 200 tokens; z ~ 11 for this seed (threshold 4)
STORY_TOKENS = 200


@pytest.fixture(scope="module")
def live(tmp_path_factory, loaded):
    from generation.engine import Engine

    home = tmp_path_factory.mktemp("openai-home")
    # the service's active key from a fixed secret: with the requests' fixed seeds the texts, and so their verdicts,
    # are the same every run (a fresh random key per run left a 200-token story short of "watermarked" now and then)
    Keyring(home).create("k-openai", secret=FIXED_SECRET)
    engine = Engine(loaded, max_num_seqs=4, max_model_len=512)
    app = create_app({"home": home, "engine": engine, "rate_limit": 0})
    store = app.extensions["provmark.store"]
    with serve(app) as base_url:
        token = make_token(store, "generate")
        client = openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0, timeout=300)
        status, key, _ = call("GET", base_url + "/v1/receipts/public-key")
        assert status == 200
        yield SimpleNamespace(url=base_url, home=home, client=client, public_key=key["public_key_pem"],
                              detector=Detector(keyring=Keyring(home)), model=client.models.list().data[0].id)
    app.extensions["provmark.generation"].worker.stop()


def provenance(response) -> dict:
    extra = response.model_extra or {}
    return extra["provmark"]


def test_models_list_names_the_served_model(live):
    models = live.client.models.list().data
    assert [m.id for m in models] == [live.model] and models[0].object == "model"


def test_completion_and_its_stream_agree(live):
    kwargs = {"model": live.model, "prompt": "The history of the lighthouse", "max_tokens": 16, "temperature": 1.0,
              "seed": 5, "extra_body": {"ignore_eos": True, "top_k": 50}}
    whole = live.client.completions.create(**kwargs)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    choice = whole.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and whole.usage.completion_tokens == 16
    receipt = provenance(whole)["receipt"]
    assert receipt["text_sha256"] == text_sha256(choice.text) and verify_receipt(receipt, live.public_key)

    chunks = list(live.client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_chat_is_watermarked_and_its_receipt_verifies_offline(live):
    response = live.client.chat.completions.create(model=live.model, messages=STORY_PROMPT, max_tokens=STORY_TOKENS,
                                                   temperature=1.0, seed=STORY_SEED)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    message = response.choices[0].message
    assert message.role == "assistant" and response.usage.completion_tokens <= STORY_TOKENS
    verdict = live.detector.detect(message.content)
    assert verdict.verdict == "watermarked" and verdict.z_score >= Z_THRESHOLD
    info = provenance(response)
    assert verdict.key_id == info["watermark"]["key_id"]
    receipt = info["receipt"]
    assert receipt["text_sha256"] == text_sha256(message.content)
    assert verify_receipt(receipt, live.public_key)
    assert not verify_receipt({**receipt, "text_sha256": text_sha256(message.content + " edited")}, live.public_key)

    chunks = list(live.client.chat.completions.create(model=live.model, messages=STORY_PROMPT, max_tokens=STORY_TOKENS,
                                                      temperature=1.0, seed=STORY_SEED, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == message.content  # same seed: the stream carries the same watermarked text
    assert chunks[-1].choices[0].finish_reason == response.choices[0].finish_reason
    assert provenance(chunks[-1])["receipt"]["text_sha256"] == text_sha256(streamed)


def test_chat_logprobs_and_unwatermarked_requests(live):
    response = live.client.chat.completions.create(
        model=live.model, messages=[{"role": "user", "content": "Name a colour."}], max_completion_tokens=4,
        logprobs=True, top_logprobs=3, seed=2, extra_body={"watermark": None})
    assert provenance(response)["watermark"] is None
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert all(len(item.top_logprobs) == 3 and item.logprob <= 0 for item in content)


def test_client_errors(live):
    with pytest.raises(openai.UnprocessableEntityError, match="n = 1"):
        live.client.chat.completions.create(model=live.model, messages=STORY_PROMPT, max_tokens=2, n=2)
    with pytest.raises(openai.NotFoundError):
        live.client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        live.client.completions.create(model=live.model, prompt="x", max_tokens=2, extra_body={"key_id": "k-nope"})
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        live.client.completions.create(model=live.model, prompt="x", max_tokens=2, temperature=-0.5)
    stranger = openai.OpenAI(base_url=live.url + "/v1", api_key="pmk_" + "B" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def test_an_embedded_manifest_ends_the_text_whole_and_streamed(live):
    kwargs = {"model": live.model, "messages": STORY_PROMPT, "max_tokens": 24, "temperature": 1.0, "seed": 11,
              "extra_body": {"c2pa": "embedded"}}
    whole = live.client.chat.completions.create(**kwargs)
    content = whole.choices[0].message.content
    found = c2pa_unstructured_text.extract(content)
    assert found is not None and provenance(whole)["c2pa"]["embedded"] is True
    visible = c2pa_unstructured_text.strip(content, found["start"], found["length"])
    assert provenance(whole)["receipt"]["text_sha256"] == text_sha256(visible)
    chunks = list(live.client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert c2pa_unstructured_text.strip(streamed, *_range(streamed)) == visible  # same seed, same words
    assert c2pa_unstructured_text.extract(streamed) is not None  # and the last delta carried the manifest
    detached = live.client.completions.create(model=live.model, prompt="The lighthouse", max_tokens=8, seed=3,
                                              extra_body={"c2pa": "inline"})
    assert provenance(detached)["c2pa"]["manifest_store"] and not provenance(detached)["c2pa"]["embedded"]


def _range(text: str) -> tuple[int, int]:
    found = c2pa_unstructured_text.extract(text)
    return found["start"], found["length"]


def test_the_official_client_raises_its_own_errors_with_the_servers_message_on_every_route(live):
    with pytest.raises(openai.UnprocessableEntityError) as bad_completion:
        live.client.completions.create(model=live.model, prompt="x", max_tokens=2, temperature=-1.0)
    assert "temperature" in bad_completion.value.message and bad_completion.value.param == "temperature"
    assert bad_completion.value.type == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError) as bad_chat:
        live.client.chat.completions.create(model=live.model, messages=[{"role": "user", "content": "x"}],
                                            max_tokens=2, top_p=7.0)
    assert "top_p" in bad_chat.value.message and bad_chat.value.code == "invalid_fields"
    outsider = openai.OpenAI(base_url=live.client.base_url, api_key="pmk_not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        outsider.models.list()
    assert refused.value.type == "authentication_error" and "token" in refused.value.message


def _documented_example() -> str:
    """The OpenAI-client example of docs/how-to/watermark-and-detect.md, as a reader copies it."""
    page = (ROOT / "docs" / "how-to" / "watermark-and-detect.md").read_text(encoding="utf-8")
    section = page.split("### From an OpenAI client", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_example_runs_and_its_receipt_verifies(live, tmp_path, monkeypatch, capsys):
    code = _documented_example()
    assert 'model="default"' in code and 'model_extra["provmark"]' in code and "key_id=" not in code
    home_line = 'home = Path.home() / ".local/share/provmark"'
    assert home_line in code and '"http://127.0.0.1:8000/v1"' in code
    code = code.replace(home_line, f"home = Path({str(live.home)!r})").replace(
        '"http://127.0.0.1:8000/v1"', repr(live.url + "/v1"))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "watermark-and-detect.md", "exec"), {})  # noqa: S102 - the page's own example
    printed = capsys.readouterr().out
    text = (tmp_path / "text.txt").read_text(encoding="utf-8")
    reply = json.loads((tmp_path / "reply.json").read_text(encoding="utf-8"))
    assert text and text in printed and reply["provmark"]["receipt"]["receipt_id"] in printed
    assert reply["provmark"]["receipt"]["text_sha256"] == text_sha256(text)
    with urllib.request.urlopen(live.url + "/.well-known/jwks.json", timeout=30) as answer:
        (tmp_path / "jwks.json").write_bytes(answer.read())  # saved once: the service here is not its iss's port
    assert main(["receipts", "verify", "reply.json", "--jwks", "jwks.json", "--text", "text.txt"]) == 0
    # the page's way to pick a key: keys=[id] in extra_body, no deprecation
    key_id = reply["provmark"]["watermark"]["key_id"]
    raw = live.client.chat.completions.with_raw_response.create(
        model="default", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4,
        extra_body={"keys": [key_id]})
    assert raw.headers.get("Deprecation") is None
    assert provenance(raw.parse())["watermark"]["key_id"] == key_id
