"""The schemathesis checks both services' fuzz tests run: every check schemathesis has (`--checks all`),
with one refinement.

``positive_data_acceptance`` expects a schema-valid request to be accepted. A few rules cannot be
written in JSON Schema: the watermark spec grammar and its numeric bounds (watermark/config.py),
a key id with the watermark switched off, min_new_tokens <= max_new_tokens, a prompt that fits the
model's context, a page cursor (opaque: only what a previous page returned). The field descriptions state them;
a 422 is accepted only when every field it names is one of these (``SEMANTIC_FIELDS``), so any other
disagreement between schema and server still fails.
"""

from __future__ import annotations

import schemathesis
from schemathesis.checks import CHECKS as REGISTRY
from schemathesis.checks import load_all_checks
from schemathesis.specs.openapi.checks import positive_data_acceptance

SEMANTIC_FIELDS = frozenset({"watermark", "key_id", "min_new_tokens", "min_tokens", "max_new_tokens", "max_tokens",
                             "max_completion_tokens", "prompt", "messages", "keys", "logit_bias", "bad_words_ids",
                             "stop_token_ids", "top_logprobs", "logprobs", "n", "echo", "forced_positions", "fpr",
                             "cursor"})


def _semantic_422(response) -> bool:
    if response.status_code != 422:
        return False
    try:
        details = response.json()["error"].get("details") or []
    except (ValueError, KeyError, TypeError):
        return False
    fields = {str(d.get("field", "")).split(".")[0] for d in details}
    return bool(fields) and fields <= SEMANTIC_FIELDS


@schemathesis.check
def positive_data_acceptance_but_documented_rules(ctx, response, case):
    """positive_data_acceptance, except 422s that name only fields with rules JSON Schema cannot state."""
    if _semantic_422(response):
        return None
    return positive_data_acceptance(ctx, response, case)


load_all_checks()
CHECKS = [check for check in REGISTRY.get_all() if check is not positive_data_acceptance
          and check is not positive_data_acceptance_but_documented_rules] + [positive_data_acceptance_but_documented_rules]
