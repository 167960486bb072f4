"""api.limits on its own: rate-limit tables that forget refilled buckets and never pass their size, failed
authentications throttled per address and per token prefix, one security-header function for both services.
Over HTTP: tests/test_detector_app.py and tests/test_generation_app.py."""

from flask import Response

from api.limits import (
    AUTH_FAILURE_BURST,
    PAGE_CSP,
    PRUNE_EVERY,
    AuthFailures,
    RateLimiter,
    prefix_key,
    security_headers,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_limiter_forgets_refilled_buckets_so_many_addresses_do_not_grow_its_table():
    clock = Clock()
    limiter = RateLimiter(60, 2, clock=clock)  # one a second, two at once
    for i in range(20 * PRUNE_EVERY):
        assert limiter.take(f"address:10.0.{i // 256}.{i % 256}") == 0.0
        clock.now += 0.01  # 100 new addresses a second: each bucket refills within 1 s
    assert len(limiter) <= 2 * PRUNE_EVERY  # without pruning: 20,480 entries


def test_a_limiter_table_never_holds_more_than_its_bound_and_keeps_the_recent_keys():
    clock = Clock()
    limiter = RateLimiter(1, 1, max_keys=3000, clock=clock)  # nothing refills during the test
    for i in range(10_000):
        limiter.take(f"address:{i}")
    assert len(limiter) <= 3000 + PRUNE_EVERY
    assert limiter.take("address:9999") > 0  # the most recent keys are kept, still limited


def test_a_full_bucket_needs_no_entry_and_waiting_counts_nothing():
    clock = Clock()
    limiter = RateLimiter(60, 2, clock=clock)
    assert limiter.wait("k") == 0.0 and len(limiter) == 0
    assert limiter.take("k") == 0.0 and limiter.take("k") == 0.0
    assert 0.9 < limiter.wait("k") <= 1.0 and 0.9 < limiter.take("k") <= 1.0
    clock.now += 2.0
    assert limiter.take("k") == 0.0


def test_failed_tokens_are_throttled_per_address_and_per_prefix_with_one_event_each():
    clock = Clock()
    failures = AuthFailures(clock=clock)
    token = "pmk_" + "x" * 43
    due = [failures.failed("10.0.0.1", token) for _ in range(AUTH_FAILURE_BURST)]
    assert due[:-1] == [[]] * (AUTH_FAILURE_BURST - 1)
    assert due[-1] == ["address:10.0.0.1", "prefix:" + prefix_key(token)]  # the failure that empties the bucket
    assert failures.address_wait("10.0.0.1") > 0  # another bad token from this address: 429
    assert failures.prefix_wait(token) > 0  # this prefix from any address: 429 before the lookup
    assert failures.address_wait("10.0.0.2") == 0.0 and failures.prefix_wait("pmk_" + "z" * 43) == 0.0
    clock.now += 10.0  # one more try each 10 s: its failure is throttled again, without a second event
    assert failures.address_wait("10.0.0.1") == 0.0 and failures.prefix_wait(token) == 0.0
    assert failures.failed("10.0.0.1", token) == []
    assert "x" not in prefix_key(token) and len(prefix_key(token)) == 16  # a short hash, not the characters


def test_security_headers_on_every_answer_and_the_page_csp_on_html():
    html = security_headers(Response("<p>hi</p>", mimetype="text/html"))
    data = security_headers(Response("{}", mimetype="application/json"))
    for response in (html, data):
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"
    assert html.headers["Content-Security-Policy"] == PAGE_CSP and "Content-Security-Policy" not in data.headers


def test_a_detector_keeps_a_bounded_number_of_request_specs(provmark_home):
    from http_fixtures import shared_vocabulary

    from detector.service import MAX_PUBLIC_SPECS, Detector

    detector = Detector(vocab=shared_vocabulary())
    for hashing_key in range(MAX_PUBLIC_SPECS + 40):  # every request its own public spec
        detector.detect("a few words of text", spec=f"hf:context_width=1,hashing_key={hashing_key + 1}")
    assert len(detector._watermarks) <= MAX_PUBLIC_SPECS
    assert any("hashing_key=104," in spec for spec, _ in detector._watermarks)  # the newest are kept
