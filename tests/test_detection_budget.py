"""The per-token daily detection budget: shared by every worker through the database, 429 with
Retry-After beyond it, one audit event when a token reaches it; explain-scope tokens are not budgeted."""

from datetime import UTC, datetime

import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary

from api.detector.app import create_app, services_of
from api.settings import Settings
from db import budget
from db.api_tokens import create_token
from db.audit import list_events
from db.caller import Caller
from watermark.keys import Keyring
from watermark.vocab import encode

pytest_plugins = ["pg"]

SHORT = "a few words"  # far fewer tokens than MIN_CHARGE_TOKENS: charged MIN_CHARGE_TOKENS each


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create("k-budget")
    return ring


def test_a_token_is_refused_once_its_daily_budget_is_used_across_workers(database_url, provmark_home, keyring):
    daily = 3 * budget.MIN_CHARGE_TOKENS
    config = {"home": provmark_home, "vocab": shared_vocabulary(), "database_url": database_url,
              "detect_budget": daily}
    first = create_app(config)
    second = create_app({**config, "detector": services_of(first).detector})  # another worker, same database
    store = services_of(first).store
    token = make_token(store, "detect")
    other = make_token(store, "detect", name="other")
    with serve(first) as url_a, serve(second) as url_b:
        answers = [call("POST", url + "/v1/detect", {"text": SHORT}, token=token)[0]
                   for url in (url_a, url_b, url_a)]
        assert answers == [200, 200, 200]
        for url in (url_b, url_a):  # both workers see the shared total
            status, body, headers = call("POST", url + "/v1/detect", {"text": SHORT}, token=token)
            assert status == 429 and body["error"]["code"] == "detection_budget_exhausted"
            assert 1 <= int(headers["Retry-After"]) <= 86401
        assert call("POST", url_b + "/v1/detect", {"text": SHORT}, token=other)[0] == 200  # per token
    events = list_events(store, kind=budget.EXHAUSTED_EVENT)
    assert len(events) == 1 and events[0].details["used_tokens"] == daily
    assert events[0].details["budget_tokens"] == daily
    store.close()


def test_explain_scope_tokens_are_not_budgeted(provmark_home, keyring):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(), "detect_budget": budget.MIN_CHARGE_TOKENS})
    store = services_of(app).store
    token = make_token(store, "detect", "explain")
    with serve(app) as base_url:
        statuses = [call("POST", base_url + "/v1/detect", {"text": SHORT}, token=token)[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    store.close()


def test_charges_add_up_atomically_and_the_crossing_is_audited_once(database_url):
    from db.store import Store

    store = Store(url=database_url)
    store.upgrade()
    caller = Caller(name="t", token_id="tok-1")
    now = datetime(2026, 11, 25, 23, 59, 0, tzinfo=UTC)
    totals = [budget.charge(store, caller, 300, 1000, now) for _ in range(5)]
    assert totals == [300, 600, 900, 1200, 1500]
    assert budget.retry_after(store, "tok-1", 1000, now) == 61  # to midnight UTC, rounded up
    assert budget.retry_after(store, "tok-1", 2000, now) == 0
    assert budget.retry_after(store, "tok-1", 1000, now.replace(day=26, hour=0)) == 0  # a new day
    assert len(list_events(store, kind=budget.EXHAUSTED_EVENT)) == 1
    store.close()


def test_charge_is_at_least_the_minimum():
    assert budget.charge_for(5) == budget.MIN_CHARGE_TOKENS
    assert budget.charge_for(5000) == 5000


def test_budget_setting_is_validated(provmark_home):
    with pytest.raises(ValueError, match="detect_budget"):
        Settings(home=provmark_home, detect_budget=-1)
    assert Settings(home=provmark_home, detect_budget="0").detect_budget == 0
    assert Settings(home=provmark_home).detect_budget == budget.DEFAULT_DAILY_TOKENS


def test_far_from_the_budget_charges_are_batched_per_process_and_near_it_written_at_once(database_url, monkeypatch):
    from db.store import Store

    monkeypatch.setattr(budget, "FLUSH_SECONDS", 3600.0)  # only the token rules apply in this test

    store = Store(url=database_url)
    store.upgrade()
    ledger = budget.UsageLedger(store)
    caller = Caller(name="t", token_id="tok-2")
    daily = 10 * budget.FLUSH_TOKENS
    per_charge = budget.FLUSH_TOKENS // 4
    ledger.retry_after("tok-2", daily)
    ledger.charge(caller, per_charge, daily)
    assert budget.used_today(store, "tok-2") == 0 and ledger.used("tok-2") == per_charge  # batched, yet counted
    for _ in range(3):
        ledger.charge(caller, per_charge, daily)
    assert budget.used_today(store, "tok-2") == budget.FLUSH_TOKENS  # a full batch is written
    other_worker = budget.UsageLedger(store)
    ledger.charge(caller, daily - budget.FLUSH_TOKENS - 1, daily)  # now within FLUSH_TOKENS of the budget
    assert other_worker.used("tok-2") == daily - 1
    ledger.charge(caller, 1, daily)
    assert other_worker.retry_after("tok-2", daily) > 0
    assert len(list_events(store, kind=budget.EXHAUSTED_EVENT)) == 1
    store.close()


def test_a_large_budget_is_written_rarely_and_still_written_through_near_its_end(database_url, monkeypatch):
    """A bulk token (a billion tokens a day) scoring 1,000-token texts at full rate: its charges must not reach
    the database every 4,000 tokens, a write per four texts (6-10 % of the service's rate in
    benchmarks/defence_cost_http.py), but at most once a batch interval; near the end of its budget every
    charge is written at once, so another worker's overshoot stays a small share of the budget."""
    from db.store import Store

    monkeypatch.setattr(budget, "FLUSH_SECONDS", 3600.0)  # only the token rules apply in this test
    writes = []
    write = budget.charge
    monkeypatch.setattr(budget, "charge", lambda store, caller, tokens, *a, **k: (
        writes.append(tokens), write(store, caller, tokens, *a, **k))[1])
    store = Store(url=database_url)
    store.upgrade()
    ledger, other_worker = budget.UsageLedger(store), budget.UsageLedger(store)
    caller = Caller(name="bulk", token_id="tok-bulk")
    daily = 10**9
    for _ in range(1000):
        assert ledger.retry_after("tok-bulk", daily) == 0
        ledger.charge(caller, 1000, daily)
    assert writes == [] and budget.used_today(store, "tok-bulk") == 0
    assert ledger.used("tok-bulk", daily) == 10**6  # batched, yet counted by this worker
    margin = budget.flush_tokens(daily)
    assert budget.FLUSH_TOKENS <= margin <= daily // 50
    ledger.charge(caller, daily - margin - 10**6, daily)  # into the margin: written at once
    assert budget.used_today(store, "tok-bulk") == daily - margin and writes == [daily - margin]
    ledger.charge(caller, margin, daily)
    assert other_worker.retry_after("tok-bulk", daily) > 0
    assert len(list_events(store, kind=budget.EXHAUSTED_EVENT)) == 1
    # a small budget keeps the fixed batch: its margin is what the existing rules say
    assert budget.flush_tokens(budget.DEFAULT_DAILY_TOKENS) == budget.FLUSH_TOKENS
    store.close()


def test_a_detection_is_charged_before_the_text_is_scored_and_settled_after(provmark_home, keyring):
    """The charge is made before any work on the text (an estimate from its length), so a second request
    of the same token sees it while the first one works; once scored, it is settled to the tokens scored."""
    daily = 10**6
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(), "detect_budget": daily})
    services = services_of(app)
    token_id, token = create_token(services.store, ["detect"], "charged", actor="test")
    text = "The harbour lantern swung over the meadow. " * 100  # 4,300 characters, about 900 tokens
    seen = []
    detect = services.detector.detect

    def observed(*args, **kwargs):  # what another request of this token reads while this one is scored
        seen.append(services.usage.used(token_id))
        return detect(*args, **kwargs)

    services.detector.detect = observed
    with serve(app) as base_url:
        status, body, _ = call("POST", base_url + "/v1/detect", {"text": text}, token=token)
    assert status == 200, body
    assert seen == [budget.estimate_for(text)] and budget.estimate_for(text) == len(text)
    services.usage.flush(daily)
    scored = budget.charge_for(len(encode(shared_vocabulary(), text)))
    assert budget.used_today(services.store, token_id) == scored < len(text)
    services.store.close()
