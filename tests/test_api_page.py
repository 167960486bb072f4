"""GET /docs on both services: a page rendered from the service's own /openapi.json, with nothing from another
origin (the detector's page CSP allows only its own resources), and no token or database needed."""

import re

import pytest
from flask import Flask, jsonify
from http_fixtures import shared_vocabulary

from api.api_page import install_api_page, operations, render_html, schemas, type_of
from api.detector.app import create_app

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", re.IGNORECASE)


def _page(client) -> str:
    response = client.get("/docs")
    assert response.status_code == 200 and response.mimetype == "text/html"
    return response.get_data(as_text=True)


def test_the_detector_serves_its_api_page(provmark_home):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    client = app.test_client()
    page = _page(client)
    document = client.get("/openapi.json").get_json()
    for path in document["paths"]:  # every operation, with its scope, and every schema
        assert f"<code>{path}</code>" in page
    assert 'id="op-detect_text_post"' in page and "<code>detect</code>" in page
    for name in document["components"]["schemas"]:
        assert f'id="schema-{name}"' in page
    assert not EXTERNAL.search(page), "the page must load nothing from another origin"
    csp = client.get("/docs").headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "style-src 'self'" in csp
    style = client.get("/docs/style.css")
    assert style.status_code == 200 and style.mimetype == "text/css"
    assert "<script" not in page and "style=" not in page  # nothing inline for the CSP to refuse


def test_the_page_needs_no_database(provmark_home):
    """Like the paste page: a detector whose database is down still shows its API."""
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(),
                      "database_url": "postgresql+psycopg://nobody@127.0.0.1:1/none"})
    assert "/v1/detect" in _page(app.test_client())
    assert app.test_client().get("/docs/style.css").status_code == 200


def test_the_generation_services_document_renders_without_a_model():
    """The generation app needs the model to start, so its page is checked here on its document as
    openapi_document() builds it (the same routes); test_generation_app_serves_its_api_page serves the real one."""
    from api.generation.app import openapi_document

    app = Flask("generation-page")
    app.add_url_rule("/openapi.json", "openapi", lambda: jsonify(openapi_document()))
    install_api_page(app)
    page = _page(app.test_client())
    for path in ("/v1/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/.well-known/jwks.json"):
        assert f"<code>{path}</code>" in page
    assert 'id="schema-GenerateRequest"' in page and not EXTERNAL.search(page)


def test_text_from_the_document_is_escaped():
    document = {"info": {"title": "<script>x</script>", "version": "1"},
                "paths": {"/a": {"get": {"summary": "<b>bold</b>", "responses": {"200": {"description": "ok"}}}}},
                "components": {"schemas": {"Thing": {"description": "a & b", "properties": {
                    "x": {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "null"}], "description": "<i>"}}}}}}
    page = render_html(document, "/docs/style.css")
    assert "<script>x" not in page and "&lt;script&gt;" in page and "&lt;b&gt;bold" in page
    assert [op.path for op in operations(document)] == ["/a"]
    (name, _, rows), = schemas(document)
    assert name == "Thing" and rows[0]["type"] == "integer or null" and "<= 3" in rows[0]["constraints"]
    assert type_of({"type": "array", "items": {"$ref": "#/components/schemas/Thing"}}) == "array of Thing"


@pytest.mark.slow  # loads the embedded model
def test_generation_app_serves_its_api_page(tmp_path, loaded):
    from api.generation.app import create_app as create_generation_app
    from generation.engine import Engine

    engine = Engine(loaded, max_num_seqs=2, max_model_len=64)
    app = create_generation_app({"home": tmp_path / "home", "engine": engine, "rate_limit": 0})
    try:
        page = _page(app.test_client())
        assert "<code>/v1/generate</code>" in page and "<code>/v1/chat/completions</code>" in page
        assert not EXTERNAL.search(page)
    finally:
        app.extensions["provmark.generation"].worker.stop()
