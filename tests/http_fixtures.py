"""Shared HTTP test helpers: serve a WSGI app on a real loopback socket, make API tokens, call JSON.

    with serve(app) as base_url:            # werkzeug make_server on 127.0.0.1:0 in a thread
        status, body, headers = call("POST", base_url + "/v1/detect", {"text": "..."}, token=tok)

``make_token(store, "detect", "explain")`` creates a token with those scopes and returns its plaintext.
``shared_vocabulary()`` loads the embedded default tokenizer once per test session.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

from werkzeug.datastructures import Headers  # case-insensitive: gunicorn's asgi worker sends lower-case names
from werkzeug.serving import make_server

CALL_TIMEOUT_S = 60.0


@contextlib.contextmanager
def serve(app, host: str = "127.0.0.1") -> Iterator[str]:
    """Run ``app`` on ``host``:<free port> in a background thread; yields ``http://host:port``."""
    server = make_server(host, 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="test-http-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def make_token(store, *scopes: str, name: str = "test") -> str:
    """A new API token with ``scopes`` (default: admin) in ``store``; returns the plaintext."""
    from db.api_tokens import create_token

    _, plaintext = create_token(store, list(scopes) or ["admin"], name, actor="test")
    return plaintext


@functools.cache
def shared_vocabulary():
    """The embedded default tokenizer, loaded once for every test in the session."""
    from watermark.vocab import load_vocabulary

    return load_vocabulary()


def call(method: str, url: str, body=None, *, token: str | None = None, headers: dict | None = None,
         raw: bytes | None = None, timeout: float = CALL_TIMEOUT_S) -> tuple[int, object, Headers]:
    """One HTTP request over the socket: (status, parsed JSON body or text, headers). Never raises on 4xx/5xx."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None and raw is None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload, response_headers = response.status, response.read(), Headers(response.headers.items())
    except urllib.error.HTTPError as error:
        status, payload, response_headers = error.code, error.read(), Headers(error.headers.items())
    content_type = response_headers.get("Content-Type", "")
    if content_type.startswith("application/json"):
        return status, json.loads(payload), response_headers
    return status, payload.decode("utf-8", "replace"), response_headers


# ---- texts ---------------------------------------------------------------------------------------
# Common whole words (one token each, with their leading space) to swap in for red word tokens.
# Mid-frequency words: a text made green through " the" and " of" would be green only through units the
# detector leaves out as common in human text (detector.common_units), i.e. no evidence at all.
FILLER_WORDS = (
    " harbour", " lantern", " meadow", " copper", " velvet", " orchard", " glacier", " compass", " saddle",
    " thunder", " marble", " pepper", " falcon", " ribbon", " canyon", " walnut", " anchor", " cotton",
    " lemon", " quarry", " timber", " violet", " beacon", " cellar", " bramble", " harvest", " pebble",
    " summit", " tavern", " willow", " garnet", " magnet", " parcel", " rocket", " silver", " tunnel",
    " acorn", " barrel", " candle", " desert", " engine", " forest", " island", " jungle", " kettle",
    " ladder", " mirror", " needle", " oyster", " puzzle",
)
KEEP_EVERY_NTH_RED = 3  # keeping some red words keeps the text half readable; z stays far above 4
HUMAN_CORPUS = "gensim/test/test_data/lee_background.cor"  # news text written by people (Lee et al. 2005)


def human_text(chars: int = 1500, start: int = 0) -> str:
    """Human-written news text from gensim's test data (located, not imported), cut at a space."""
    import importlib.metadata

    path = importlib.metadata.distribution("gensim").locate_file(HUMAN_CORPUS)
    text = " ".join(path.read_text(encoding="utf-8").split())[start:start + chars]
    return text[: text.rfind(" ")]


def watermarked_text(vocab, secret: bytes, source: str, spec=None, max_tokens: int = 260) -> str:
    """``source`` rewritten so that about two thirds of its tokens are green under ``secret`` and ``spec``.

    Left to right, a word token that is red given the (already rewritten) tokens before it is replaced
    by a green word of ``FILLER_WORDS`` (tried from a rotating start, so choices vary), except every
    third one: no language model, a clearly detectable text that still reads half like the source.
    Only whole words followed by a space or punctuation are swapped, so the text re-tokenizes the same.
    """
    from watermark.config import WatermarkSpec
    from watermark.scheme import Watermark
    from watermark.vocab import encode

    mark = Watermark(spec or WatermarkSpec.default(), secret, vocab.vocab_size)
    fillers = [ids[0] for ids in (encode(vocab, w) for w in FILLER_WORDS) if len(ids) == 1]
    pieces = vocab.tokenizer.convert_ids_to_tokens
    ids = encode(vocab, source)[:max_tokens]
    h = mark.context_width
    out, red_words = list(ids[:h]), 0

    def is_green(token: int) -> bool:
        return bool(mark.green_flags(out[len(out) - h:] + [token])[0])

    for i in range(h, len(ids)):
        token = ids[i]
        following = pieces(ids[i + 1]) if i + 1 < len(ids) else "Ġ"
        ends_word = following.startswith("Ġ") or not following[:1].isalnum()  # Ġ: the byte-level space
        swappable = pieces(token).startswith("Ġ") and pieces(token)[1:].isalpha() and ends_word
        if swappable and not is_green(token):
            red_words += 1
            if red_words % KEEP_EVERY_NTH_RED:
                rotated = fillers[i % len(fillers):] + fillers[:i % len(fillers)]
                token = next((f for f in rotated if f != out[-1] and is_green(f)), token)
        out.append(token)
    return vocab.tokenizer.decode(out)


def single_token_words(vocab, count: int) -> list[int]:
    """The first ``count`` lowercase words that are one token each with their leading space, so a text of them
    decodes and re-tokenizes to the same ids (the toy worlds of the spoof tests)."""
    words = []
    for token_id in range(vocab.vocab_size):
        piece = vocab.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece.startswith("\u0120") and piece[1:].isalpha() and piece[1:].islower():
            if vocab.tokenizer(" " + piece[1:], add_special_tokens=False)["input_ids"] == [token_id]:
                words.append(token_id)
        if len(words) == count:
            break
    return words
