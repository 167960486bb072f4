"""What C2PA Content Credentials cost per generated text: p50/p95 of signing (detached, embedded) and
reading (detached, embedded, a text without credentials), for a text of about 200 tokens, the sizes
they add, and the parts of a signing (what is cached per thread, what is made per call).

Runs in a temporary PROVMARK_HOME with a development credential (Ed25519), one thread.

    python benchmarks/c2pa_cost.py [--repeats 300] [--out FILE]

Writes benchmarks/results/c2pa_cost.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import c2pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentiles, write_result  # noqa: E402
from provenance.c2pa_credential import DevelopmentCa, load_c2pa_credential, new_development_ca  # noqa: E402
from provenance.c2pa_manifest import TextClaims, WatermarkClaim, manifest_definition, sign_text  # noqa: E402
from provenance.c2pa_native import (  # noqa: E402
    SIGNING_SETTINGS,
    hashed_placeholder_size,
    new_builder,
    sign_data_hashed,
    signer_for,
)
from provenance.c2pa_reading import read_credentials  # noqa: E402

# 150 English words, ~1,000 characters: about 200 tokens for a BPE tokenizer of an English LLM
TEXT = ("The committee met on Tuesday to review the draft budget, and most members agreed that the "
        "proposed cuts to the library and the youth programmes went too far. ") * 5 + (
        "After a long debate the chair asked staff to prepare two alternatives, one keeping the opening "
        "hours as they are and one closing the smaller branches on Mondays, with the costs of each set "
        "out clearly before the next meeting in three weeks.")
CLAIMS = TextClaims(model_id="smollm2-135m-instruct", receipt_id="3f1c2a9e-0000-4000-8000-000000000001",
                    issuer="https://gen.example.org", detector_url="https://detect.example.org/v1/detect",
                    watermark=WatermarkClaim("kgw", "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256",
                                             "0123456789abcdef", "k-main"))


def signing_parts(credential, repeats: int) -> dict:
    """The parts of one signing: what sign_text makes per call and what it keeps per thread, and what
    c2pa-rs's check of each new manifest (verify_after_sign) costs."""
    definition = manifest_definition(CLAIMS, "urn:c2pa:00000000-0000-4000-8000-000000000000")
    signer = signer_for(credential)
    unchecked = c2pa.Context.from_dict({**SIGNING_SETTINGS, "verify": {"verify_after_sign": False}})
    data_hash = {"exclusions": [], "name": "jumbf manifest", "alg": "sha256",
                 "hash": list(hashlib.sha256(TEXT.encode()).digest()), "pad": []}

    def placeholder():
        hashed_placeholder_size(new_builder(credential, definition), signer)

    def sign(context):
        builder = c2pa.Builder(definition, context=context)
        hashed_placeholder_size(builder, signer)
        sign_data_hashed(builder, signer, data_hash)

    checked = credential.per_thread.context
    return {"builder_per_call": percentiles(lambda: new_builder(credential, definition), repeats),
            "builder_and_placeholder_per_call": percentiles(placeholder, repeats),
            "sign_verify_after_sign_on": percentiles(lambda: sign(checked), repeats),
            "sign_verify_after_sign_off": percentiles(lambda: sign(unchecked), repeats),
            "context_if_not_cached": percentiles(lambda: c2pa.Context.from_dict(SIGNING_SETTINGS), repeats),
            "signer_if_not_cached": percentiles(lambda: c2pa.Signer.from_callback(
                credential.sign, c2pa.C2paSigningAlg.ED25519, credential.chain_pem, None), repeats)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "c2pa_cost.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        os.environ["PROVMARK_HOME"] = home
        started = time.perf_counter()
        root_key, root_pem, signer_key, signer_pem = new_development_ca(datetime.now(UTC))
        credential = load_c2pa_credential(development=DevelopmentCa(root_pem, root_key, signer_key, signer_pem))
        created_ms = (time.perf_counter() - started) * 1e3
        anchors = credential.trust_anchors_pem
        detached = sign_text(credential, TEXT, CLAIMS)
        embedded = sign_text(credential, TEXT, CLAIMS, embedded=True)
        assert read_credentials(TEXT, detached.manifest_store, anchors).trusted
        assert read_credentials(embedded.text, None, anchors).trusted
        n = args.repeats
        result = {
            "text": {"characters": len(TEXT), "utf8_bytes": len(TEXT.encode()), "approx_tokens": 200},
            "credential": {"create_first_ms": round(created_ms, 2),
                           "load_existing": percentiles(load_c2pa_credential, 20, warmup=1)},
            "sign_detached": percentiles(lambda: sign_text(credential, TEXT, CLAIMS), n),
            "sign_embedded": percentiles(lambda: sign_text(credential, TEXT, CLAIMS, embedded=True), n),
            "read_detached": percentiles(lambda: read_credentials(TEXT, detached.manifest_store, anchors), n),
            "read_embedded": percentiles(lambda: read_credentials(embedded.text, None, anchors), n),
            "read_without_credentials": percentiles(lambda: read_credentials(TEXT), n * 10),
            "signing_parts": signing_parts(credential, n),
            "sizes": {"manifest_store_bytes": len(detached.manifest_store),
                      "signer_reserve_bytes": signer_for(credential).reserve_size(),
                      "embedded_text_utf8_bytes": len(embedded.text.encode()),
                      "wrapper_utf8_bytes": embedded.exclusion[1]},
            "machine": {"python": platform.python_version(), "c2pa_rs": c2pa.sdk_version(),
                        "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
