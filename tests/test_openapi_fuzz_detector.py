"""schemathesis against the detector's live /openapi.json over a real socket, with an admin token:
no 5xx, and every answer (status code, content type, headers, body) is one the document allows.

Both valid requests (built from the schemas) and invalid ones (schema-violating: expected 4xx)
are sent to every operation. Example counts are kept moderate so the file runs in well under 2 min.
"""

import pytest
import schemathesis
from fuzz_checks import CHECKS  # every check schemathesis has (tests/fuzz_checks.py)
from http_fixtures import serve, shared_vocabulary
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from api.detector.app import create_app
from api.limits import AuthFailures
from watermark.keys import Keyring

EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 30}  # per operation


@pytest.fixture
def live_detector(provmark_home):
    Keyring(provmark_home).create("k-fuzz")
    # No rate limit: the fuzzer sends hundreds of requests with one token on purpose, and its invalid-credentials
    # check sends bad tokens over and over from one address (a client that would be throttled: tests/test_limits.py)
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(), "rate_limit": 0,
                      "max_text_chars": 5000, "auth_failures": AuthFailures(burst=1_000_000)})
    admin = (provmark_home / "admin.token").read_text().strip()
    with serve(app) as base_url:
        yield base_url, admin


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_every_operation_answers_within_its_schema(live_detector, mode):
    base_url, admin = live_detector
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/detect", "/v1/verdicts", "/v1/verdicts/{verdict_id}",
                                              "/v1/audit", "/v1/audit/verify", "/healthz", "/"}
    headers = {"Authorization": f"Bearer {admin}"}
    calls, skipped = [], []

    def exerciser(operation):
        @settings(max_examples=EXAMPLES[mode], deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def exercise(case):
            response = case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)
            calls.append((operation.path, response.status_code))

        return exercise

    for operation in operations:
        exercise = exerciser(operation)
        try:
            exercise()
        except Unsatisfiable:
            # Operations without parameters or body (GET /, /healthz, /v1/audit/verify) have no invalid form.
            assert mode is GenerationMode.NEGATIVE
            skipped.append(operation.path)

    assert len(calls) >= len(operations) - len(skipped)
    assert "/v1/detect" not in skipped
    assert all(status < 500 for _, status in calls)
    if mode is GenerationMode.POSITIVE:  # valid requests do get through, not only errors
        assert any(path == "/v1/detect" and status == 200 for path, status in calls)
