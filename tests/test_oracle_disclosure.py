"""What a ``detect``-scope caller sees must not reveal colours (attack (a) of the threat model; spec switching and
gamma stepping are in test_oracle.py).

A 5-token text has exactly one scored unit under the default spec (h = 4), so any score field of its
verdict that depends on that unit's colour reveals the colour: the detect-scope view, through the Python
API (``Verdict.disclose``) and the HTTP service with a detect-scope token, must carry none.
"""

import random
from collections import Counter

import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary

from api.detector.app import create_app, services_of
from detector.scoring_request import DetectOptions
from detector.service import Detector
from watermark.keys import Keyring
from watermark.vocab import encode

KEY = "k-oracle"
FIXED_SECRET = bytes.fromhex("0b7e4a1c93d25f8e6a0c1d2b3e4f5a6978a9bacbdcedfe0f1a2b3c4d5e6f7081")
# Fields that say who asked and what was sent, not how it scored: excluded from the oracle's view.
REQUEST_ECHO = {"id", "text_sha256", "text_length", "provenance"}


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create(KEY, secret=FIXED_SECRET)
    return ring


@pytest.fixture(scope="module")
def five_token_texts():
    """Texts of five whole-word tokens that re-tokenize to exactly those five tokens."""
    vocab = shared_vocabulary()
    pieces = vocab.tokenizer.convert_ids_to_tokens(list(range(vocab.vocab_size)))
    words = [i for i, p in enumerate(pieces) if p.startswith("Ġ") and p[1:].isalpha() and p[1:].islower()
             and len(p) > 4]
    rng = random.Random(17)
    out = []
    while len(out) < 40:
        text = vocab.tokenizer.decode(rng.sample(words, 5))
        if len(encode(vocab, text)) == 5:
            out.append(text)
    return out


def true_colours(keyring, texts) -> list[bool | None]:
    """The real colour of each text's one counted unit (None when it is not counted), via explain."""
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    colours = []
    for text in texts:
        counted = [t for t in detector.detect(text, options=DetectOptions(explain=True)).explanation if t["counted"]]
        colours.append(counted[0]["green"] if len(counted) == 1 else None)
    return colours


def lookup_table_accuracy(views: list, colours: list[bool]) -> tuple[float, float]:
    """(accuracy of the best predictor that maps each distinct view to a colour, majority-class rate).

    Equal accuracies mean the views carry no information about the colours at all."""
    by_view: dict = {}
    for view, colour in zip(views, colours):
        by_view.setdefault(view, Counter())[colour] += 1
    best = sum(max(c.values()) for c in by_view.values()) / len(colours)
    majority = max(Counter(colours).values()) / len(colours)
    return best, majority


def oracle_view(response: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in response.items() if k not in REQUEST_ECHO))


# ---- (a) one scored position -----------------------------------------------------------------------

def test_detect_scope_view_of_a_five_token_text_reveals_no_colour_python_api(keyring, five_token_texts):
    colours = true_colours(keyring, five_token_texts)
    pairs = [(t, c) for t, c in zip(five_token_texts, colours) if c is not None]
    assert len(pairs) >= 20 and 0 < sum(c for _, c in pairs) < len(pairs)  # both colours present
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    views = [oracle_view(detector.detect(t).disclose("detect")) for t, _ in pairs]
    best, majority = lookup_table_accuracy(views, [c for _, c in pairs])
    assert best == majority


def test_detect_scope_view_of_a_five_token_text_reveals_no_colour_http(provmark_home, keyring, five_token_texts):
    colours = true_colours(keyring, five_token_texts)
    pairs = [(t, c) for t, c in zip(five_token_texts, colours) if c is not None]
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    token = make_token(store, "detect")
    views = []
    with serve(app) as base_url:
        for text, _ in pairs:
            status, body, _ = call("POST", base_url + "/v1/detect", {"text": text}, token=token)
            assert status == 200 and body["verdict"] == "insufficient_text"
            for field in ("z_score", "p_value", "p_value_normal", "num_green_tokens", "green_fraction", "keys"):
                assert body.get(field) is None, field  # insufficient_text carries no score at all
            views.append(oracle_view(body))
        # the stored row keeps the full numbers: the audit trail loses nothing
        stored = store.get_verdict(body["id"])
        assert stored["scored_count"] == 1 and stored["green_count"] in (0, 1)
    store.close()
    best, majority = lookup_table_accuracy(views, [c for _, c in pairs])
    assert best == majority
