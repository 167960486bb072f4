"""``GET /docs``: a browsable page of a service's own OpenAPI document, for both services.

The page is rendered on the server from the document the app serves at ``/openapi.json`` (found through
the app's URL map, so both services register it the same way: ``install_api_page(app)``). It is plain HTML
with a style sheet served by the same blueprint (``/docs/style.css``): no script, no font, nothing from
another origin, so it works offline and under the detector's page CSP (``style-src 'self'``). Neither
route needs a token or the database.

The walk over the document (``operations``, ``schemas``, ``type_of``) is shared with the generated HTTP
reference of the documentation site (docs/gen_reference.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from html import escape

from flask import Blueprint, Flask, Response, current_app, url_for

PAGE_PATH = "/docs"
ENDPOINTS = frozenset({"api_page.page", "api_page.style"})  # what a service's database checks may skip
METHOD_ORDER = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    tag: str
    scopes: tuple[str, ...]  # every scope the route needs (all of them); empty: no token
    parameters: list[dict]
    body: str | None  # the request body's schema name
    responses: list[tuple[str, str, str | None]]  # (status, description, schema name or media type)
    operation_id: str


def operations(document: dict) -> Iterator[Operation]:
    """Every operation of the document, by path, then method."""
    for path in sorted(document.get("paths", {})):
        item = document["paths"][path]
        for method in sorted(item, key=lambda m: METHOD_ORDER.index(m) if m in METHOD_ORDER else 99):
            op = item[method]
            body = None
            for media in op.get("requestBody", {}).get("content", {}).values():
                body = _ref_name(media.get("schema", {})) or body
            responses = []
            for status in sorted(op.get("responses", {})):
                response = op["responses"][status]
                shown = None
                for media, content in response.get("content", {}).items():
                    name = _ref_name(content.get("schema", {}))
                    shown = name if name else (shown or media)
                responses.append((status, response.get("description", ""), shown))
            yield Operation(method=method.upper(), path=path, summary=op.get("summary", ""),
                            tag=(op.get("tags") or ["other"])[0], scopes=scopes_of(op),
                            parameters=op.get("parameters", []), body=body, responses=responses,
                            operation_id=op.get("operationId", f"{method}_{path}"))


def scopes_of(operation: dict) -> tuple[str, ...]:
    """The scopes an operation needs: ``x-required-scope`` is one name, or a list of names a token must all hold."""
    needed = operation.get("x-required-scope")
    if not needed:
        return ()
    return (needed,) if isinstance(needed, str) else tuple(needed)


def schemas(document: dict) -> Iterator[tuple[str, str, list[dict]]]:
    """(name, description, fields) of every schema; a field is a dict of name, type, required,
    description and constraints (text)."""
    for name in sorted(document.get("components", {}).get("schemas", {})):
        schema = document["components"]["schemas"][name]
        required = set(schema.get("required", []))
        rows = [{"name": prop, "type": type_of(sub), "required": prop in required,
                 "description": sub.get("description", ""), "constraints": constraints_of(sub)}
                for prop, sub in schema.get("properties", {}).items()]
        if not rows and "enum" in schema:
            rows = [{"name": "(value)", "type": type_of(schema), "required": True, "description": "",
                     "constraints": constraints_of(schema)}]
        yield name, schema.get("description", ""), rows


def type_of(schema: dict) -> str:
    """A JSON schema's type in a few words: ``string``, ``array of Message``, ``integer or null``."""
    if not isinstance(schema, dict):
        return "any"
    if "$ref" in schema:
        return _ref_name(schema) or "object"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = []
            for part in schema[key]:
                text = type_of(part)
                if text not in parts:
                    parts.append(text)
            return " or ".join(parts)
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0])
    if "const" in schema:
        return f"{schema['const']!r}"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    return kind or "any"


def constraints_of(schema: dict) -> str:
    """Bounds, choices and the default of a field, as text."""
    found = []
    for part in [schema, *schema.get("anyOf", [])]:
        if not isinstance(part, dict):
            continue
        if "enum" in part:
            found.append("one of " + ", ".join(str(value) for value in part["enum"]))
        for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                          ("exclusiveMaximum", "<"), ("minLength", "length >="), ("maxLength", "length <="),
                          ("minItems", "items >="), ("maxItems", "items <="), ("pattern", "pattern")):
            if key in part:
                found.append(f"{word} {part[key]}")
    if "default" in schema and schema["default"] is not None:
        found.append(f"default {json.dumps(schema['default'])}")
    return "; ".join(found)


def _ref_name(schema: dict) -> str | None:
    ref = schema.get("$ref", "") if isinstance(schema, dict) else ""
    return ref.rsplit("/", 1)[-1] if ref else None


# ---- the page ------------------------------------------------------------------------------------

def install_api_page(app: Flask) -> None:
    """Serve ``GET /docs`` (and its style sheet) from the app's own ``/openapi.json``."""
    bp = Blueprint("api_page", __name__)
    rendered: dict[str, str] = {}

    @bp.get(PAGE_PATH)
    def page():
        if "html" not in rendered:
            rendered["html"] = render_html(_served_document(), url_for("api_page.style"))
        return Response(rendered["html"], mimetype="text/html")

    @bp.get(PAGE_PATH + "/style.css")
    def style():
        response = Response(STYLE, mimetype="text/css")
        response.headers["Cache-Control"] = "public, max-age=3600"
        return response

    app.register_blueprint(bp)


def _served_document() -> dict:
    """What this app answers at /openapi.json, called in-process (no second request)."""
    endpoint, arguments = current_app.url_map.bind("localhost").match("/openapi.json", method="GET")
    response = current_app.make_response(current_app.view_functions[endpoint](**arguments))
    return response.get_json()


def render_html(document: dict, style_url: str) -> str:
    info = document.get("info", {})
    title = escape(info.get("title", "API"))
    ops = list(operations(document))
    tags: dict[str, list[Operation]] = {}
    for op in ops:
        tags.setdefault(op.tag, []).append(op)
    out = ["<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{title} · API</title>", f'<link rel="stylesheet" href="{escape(style_url)}">',
           '<link rel="icon" href="data:,">', "</head>", "<body>", "<main>",
           f"<h1>{title} <small>{escape(str(info.get('version', '')))}</small></h1>",
           f"<p>{escape(info.get('description', ''))}</p>",
           '<p>The machine-readable document: <a href="openapi.json">/openapi.json</a>. Operations that name a '
           "scope take <code>Authorization: Bearer TOKEN</code> with that scope.</p>",
           '<nav><h2>Operations</h2><ul>']
    for op in ops:
        out.append(f'<li><a href="#{_anchor(op)}"><span class="method {op.method.lower()}">{op.method}</span> '
                   f"<code>{escape(op.path)}</code></a> {escape(op.summary)}</li>")
    out.append('</ul><p><a href="#schemas">Schemas</a></p></nav>')
    for tag, members in tags.items():
        out.append(f"<section><h2>{escape(tag)}</h2>")
        for op in members:
            out.append(_operation_html(op))
        out.append("</section>")
    out.append('<section id="schemas"><h2>Schemas</h2>')
    for name, description, rows in schemas(document):
        out.append(f'<article class="schema" id="schema-{escape(name)}"><h3>{escape(name)}</h3>')
        if description:
            out.append(f"<p>{escape(description)}</p>")
        if rows:
            out.append("<table><thead><tr><th>field</th><th>type</th><th>required</th><th>description</th>"
                       "<th>constraints</th></tr></thead><tbody>")
            for row in rows:
                out.append(f"<tr><td><code>{escape(row['name'])}</code></td><td>{_type_html(row['type'])}</td>"
                           f"<td>{'yes' if row['required'] else ''}</td><td>{escape(row['description'])}</td>"
                           f"<td>{escape(row['constraints'])}</td></tr>")
            out.append("</tbody></table>")
        out.append("</article>")
    out += ["</section>", "</main>", "</body>", "</html>"]
    return "\n".join(out)


def _scopes_html(scopes: tuple[str, ...]) -> str:
    if not scopes:
        return "<p>No token needed.</p>"
    label = "Scope" if len(scopes) == 1 else "Scopes (all of them)"
    return f"<p>{label}: " + " and ".join(f"<code>{escape(s)}</code>" for s in scopes) + "</p>"


def _operation_html(op: Operation) -> str:
    out = [f'<article class="operation" id="{_anchor(op)}">',
           f'<h3><span class="method {op.method.lower()}">{op.method}</span> <code>{escape(op.path)}</code></h3>',
           f"<p>{escape(op.summary)}</p>",
           _scopes_html(op.scopes)]
    if op.parameters:
        out.append("<table><thead><tr><th>parameter</th><th>in</th><th>type</th><th>required</th>"
                   "<th>description</th></tr></thead><tbody>")
        for param in op.parameters:
            schema = param.get("schema", {})
            out.append(f"<tr><td><code>{escape(param['name'])}</code></td><td>{escape(param.get('in', ''))}</td>"
                       f"<td>{_type_html(type_of(schema))}</td><td>{'yes' if param.get('required') else ''}</td>"
                       f"<td>{escape(schema.get('description', ''))}</td></tr>")
        out.append("</tbody></table>")
    if op.body:
        out.append(f"<p>Body: {_type_html(op.body)} (JSON)</p>")
    out.append("<ul class=\"responses\">")
    for status, description, shown in op.responses:
        out.append(f"<li><strong>{escape(status)}</strong> {escape(description)}"
                   + (f": {_type_html(shown)}" if shown else "") + "</li>")
    out.append("</ul></article>")
    return "\n".join(out)


def _type_html(text: str) -> str:
    """A type with every schema name in it linked to the schema."""
    words = []
    for word in text.split(" "):
        if word[:1].isupper() and word.isidentifier():
            words.append(f'<a href="#schema-{escape(word)}">{escape(word)}</a>')
        else:
            words.append(escape(word))
    return " ".join(words)


def _anchor(op: Operation) -> str:
    return "op-" + escape(op.operation_id)


STYLE = """\
:root { --bg: #f6f7f9; --card: #fff; --ink: #1b1f24; --muted: #57606a; --line: #d0d7de; --accent: #3849c8;
  color-scheme: light dark; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0f1216; --card: #171b21; --ink: #e6e9ed; --muted: #9aa4af; --line: #2f3640; --accent: #8c9bff; }
}
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 72rem; margin: 0 auto; padding: 1rem 1.25rem 4rem; }
a { color: var(--accent); }
h1 small { color: var(--muted); font-weight: normal; font-size: 0.6em; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.95em; }
.operation, .schema, nav { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 0.5rem 1rem; margin: 0.75rem 0; }
.method { display: inline-block; min-width: 4.2em; font: bold 0.8em ui-monospace, monospace; text-align: center;
  border-radius: 4px; padding: 0.1em 0.4em; background: var(--line); }
.method.get { background: #d7ebff; color: #0b3d75; }
.method.post { background: #dcf3e3; color: #0f5223; }
.method.delete { background: #ffe0dc; color: #82071e; }
table { border-collapse: collapse; width: 100%; margin: 0.5rem 0; font-size: 0.92em; }
th, td { border-bottom: 1px solid var(--line); padding: 0.3rem 0.5rem; text-align: left; vertical-align: top; }
nav ul, .responses { padding-left: 1.2rem; }
"""
