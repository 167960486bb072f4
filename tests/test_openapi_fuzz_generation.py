"""schemathesis against the generation service's live /openapi.json over a real socket: no 5xx, and
every answer (status code, content type, headers, body) is one the document allows.

Valid requests (built from the schemas) and invalid ones (expected 4xx) go to every operation. The
engine behind the app has max_model_len = 64, so any fuzzed request costs at most ~64 tokens (longer
prompts are 422s, longer generations stop with finish_reason "length") and the file stays fast.
"""

import pytest
import schemathesis
from fuzz_checks import CHECKS  # every check schemathesis has (tests/fuzz_checks.py)
from http_fixtures import serve
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from api.generation.app import create_app
from api.limits import AuthFailures

pytestmark = pytest.mark.slow  # loads the embedded model

EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 50}  # per operation; valid ones generate (~1 s each)
FUZZ_MODEL_LEN = 64  # tokens of prompt + output per request (the chat template alone takes ~30)
GENERATING = {"/v1/generate", "/v1/completions", "/v1/chat/completions"}


@pytest.fixture(scope="module")
def live_generation(tmp_path_factory, loaded):
    from generation.engine import Engine

    home = tmp_path_factory.mktemp("fuzz-home")
    engine = Engine(loaded, max_num_seqs=4, max_model_len=FUZZ_MODEL_LEN)
    # No rate limit: the fuzzer sends hundreds of requests with one token on purpose.
    app = create_app({"home": home, "engine": engine, "rate_limit": 0, "max_text_chars": 2000,
                      "auth_failures": AuthFailures(burst=1_000_000)})  # the invalid-credentials check, repeated
    with serve(app) as base_url:
        yield base_url, (home / "admin.token").read_text().strip(), app.extensions["provmark.generation"].worker
    app.extensions["provmark.generation"].worker.stop()


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=lambda m: m.value)
def test_every_operation_answers_within_its_schema(live_generation, mode):
    base_url, admin, worker = live_generation
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= GENERATING | {"/v1/models", "/healthz", "/v1/receipts/public-key"}
    headers = {"Authorization": f"Bearer {admin}"}
    calls, skipped = [], []

    def fuzz(operation):
        @settings(max_examples=EXAMPLES[mode], deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def exercise(case):
            response = case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=120)
            calls.append((operation.path, response.status_code))

        exercise()

    for operation in operations:
        try:
            fuzz(operation)
        except Unsatisfiable:
            # Operations without parameters or body (GET /healthz, /v1/models, ...) have no invalid form.
            assert mode is GenerationMode.NEGATIVE
            skipped.append(operation.path)

    assert len(calls) >= len(operations) - len(skipped)
    assert not GENERATING & set(skipped)
    assert all(status < 500 for _, status in calls)
    assert worker.stats()["failures"] == 0  # no engine step failed on a fuzzed request
    if mode is GenerationMode.POSITIVE:  # valid requests do get through, not only errors
        assert {path for path, status in calls if status == 200} >= GENERATING
