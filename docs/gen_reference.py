"""The reference pages that are generated from the code, so they cannot drift from it.

* ``reference/cli.md`` from the argparse parser (``api.cli.main.build_parser``): every command and
  sub-command, its usage, description and options;
* ``reference/http.md`` from both services' OpenAPI documents: the detector's as its app serves it
  (``create_app`` on a temporary home, ``GET /openapi.json``), the generation service's from
  ``api.generation.app.openapi_document()`` (its routes without a model or an engine);
* ``reference/settings.md`` from ``api.settings``: the ``Settings`` fields (variable, default from the
  dataclass, meaning and service from the module's table) and ``READ_ELSEWHERE``.

``python docs/gen_reference.py`` writes them into docs/reference/ (``make docs`` runs it before the site
build). They are committed, so they can be read in the repository too, and tests/test_docs.py fails when a
committed page differs from a fresh generation: change the code, run ``make docs``, commit both.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # document this checkout's code, whatever is installed
    sys.path.insert(0, str(ROOT))

import api.settings as settings  # noqa: E402 - after the path above
from api.api_page import operations, schemas, type_of  # noqa: E402
from api.cli.main import build_parser  # noqa: E402
from api.detector.app import create_app  # noqa: E402
from api.generation.app import openapi_document  # noqa: E402
from watermark.paths import DEFAULT_HOME  # noqa: E402

SERVICES = ("both", "detector", "generation")


# ---- text helpers ----------------------------------------------------------------------------------

def _inline(text: str) -> str:
    """Help text as Markdown: code spans kept, Markdown's own characters escaped elsewhere."""
    parts = (text or "").replace("``", "`").split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"`{part}`")
        else:
            out.append(re.sub(r"([\\*_<>\[\]|#])", r"\\\1", part))
    if len(parts) % 2 == 0:  # an unpaired backtick: show it as it is
        out[-1] = out[-1].replace("`", "\\`")
    return "".join(out)


def _cell(text: str) -> str:
    return _inline(" ".join(str(text).split()))


def _description(text: str) -> str:
    """A parser description or docstring: paragraphs as text, indented blocks as code."""
    blocks, out = re.split(r"\n\s*\n", (text or "").strip("\n")), []
    for block in blocks:
        lines = block.splitlines()
        if lines and all(line.startswith("    ") or not line.strip() for line in lines):
            out.append("```text\n" + "\n".join(line[4:] for line in lines) + "\n```")
        else:
            out.append(_inline(" ".join(line.strip() for line in lines)))
    return "\n\n".join(out)


def _slug(*words: str) -> str:
    return "-".join(re.sub(r"[^a-z0-9]+", "-", w.lower()).strip("-") or "root" for w in words if w)


# ---- the CLI ----------------------------------------------------------------------------------------

def cli_commands(parser=None):
    """(path, parser, one-line help) of every command and sub-command, depth first in help order."""
    parser = parser or build_parser()
    found = []

    def walk(p, path):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    child = action.choices[choice.dest]
                    found.append((path + [choice.dest], child, choice.help or ""))
                    walk(child, path + [choice.dest])

    walk(parser, ["provmark"])
    return found


def cli_page() -> str:
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal: the page should not depend on it
    try:
        return _cli_page(build_parser())
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def _cli_page(parser) -> str:
    commands = cli_commands(parser)
    out = ["# Command line (`provmark`)", "",
           "Every command and option of `provmark`, as the installed parser defines them; `provmark COMMAND "
           "--help` prints the same. This page is generated from `api/cli/main.py` by `docs/gen_reference.py` "
           "at every build of the site.", "",
           "Errors a user can fix (an unknown key, a bad spec, an unreadable file) print one line, "
           "`provmark: MESSAGE`, and exit with status 2; `detect` exits 0 whatever the verdict.", "",
           "## Commands", ""]
    for path, _, help_text in commands:
        out.append(f"{'  ' * (len(path) - 2)}- [`{' '.join(path)}`](#{_slug(*path)}): {_cell(help_text)}")
    out.append("")
    for path, child, help_text in commands:
        level = "##" if len(path) == 2 else "###"
        out += [f"{level} `{' '.join(path)}` {{#{_slug(*path)}}}", "",
                "```text", _usage(child), "```", ""]
        description = child.description or help_text
        if description:
            out += [_description(description), ""]
        formatter = child._get_formatter()
        options = [a for a in child._actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if options:
            out += ["| argument | meaning |", "|---|---|"]
            for action in options:
                out.append(f"| {_argument(action)} | {_cell(_help(formatter, action))} |")
            out.append("")
    return "\n".join(out)


def _usage(parser) -> str:
    """The usage lines without argparse's ``usage: `` prefix, continuation lines shifted to match."""
    lines = parser.format_usage().rstrip().splitlines()
    prefix = "usage: "
    return "\n".join([lines[0][len(prefix):]] + [line[len(prefix):] if line.startswith(" " * len(prefix)) else line
                                                  for line in lines[1:]])


def _argument(action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs != 0:
            metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                         else action.dest.upper())
            names += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
        return f"`{names}`"
    metavar = action.metavar or action.dest
    suffix = {"*": " ...", "+": " ...", "?": " (optional)"}.get(action.nargs, "")
    return f"`{metavar}`{suffix}"


def _help(formatter, action) -> str:
    text = formatter._expand_help(action) if action.help else ""
    extra = []
    if action.choices and not action.metavar and action.option_strings == []:
        extra.append("one of " + ", ".join(map(str, action.choices)))
    if isinstance(action, argparse._AppendAction):
        extra.append("repeatable")
    if action.required and action.option_strings:
        extra.append("required")
    return "; ".join([t for t in [text, *extra] if t])


# ---- HTTP ------------------------------------------------------------------------------------------

def detector_document() -> dict:
    """The detector's document as its app serves it, from an app on a temporary home (no tokenizer, no
    database bootstrap: routes are registered, never called)."""
    with tempfile.TemporaryDirectory() as home:
        app = create_app({"home": home, "bootstrap": False, "detector": object(), "rate_limit": 0})
        document = app.test_client().get("/openapi.json").get_json()
        app.extensions["provmark_detector"].store.close()
    return document


def generation_document() -> dict:
    return openapi_document()


def http_page() -> str:
    out = ["# HTTP API", "",
           "Every route of both services, with its scope, parameters, body and answers, and every schema they "
           "use. It is generated from the same OpenAPI documents that the services serve at `/openapi.json` "
           "(and show as a page at `/docs`), by `docs/gen_reference.py` at every build of the site.", "",
           "A route that names a scope needs `Authorization: Bearer TOKEN` from a token with that scope "
           "(`provmark tokens create --scopes ...`). Errors are always JSON, "
           '`{"error": {"code": ..., "message": ..., "details": [...]}}`, with the status the table names; '
           "429 comes with `Retry-After`.", "",
           "Both services also answer `GET /openapi.json` (the document), `GET /docs` (the same as a page) and "
           "`GET /metrics` (Prometheus; a bearer token when `PROVMARK_METRICS_TOKEN` is set), which the documents "
           "do not list.", "",
           "- [Detector service](#detector-service) (default `127.0.0.1:8001`)",
           "- [Generation service](#generation-service) (default `127.0.0.1:8000`): its routes also serve "
           "server-sent events when a request asks for `stream: true`, and its served document names the "
           "model this process runs.", ""]
    for key, title, document in (("detector", "Detector service", detector_document()),
                                 ("generation", "Generation service", generation_document())):
        out += _service_section(key, title, document)
    return "\n".join(out)


def _service_section(key: str, title: str, document: dict) -> list[str]:
    info = document.get("info", {})
    out = [f"## {title} {{#{key}-service}}", "", _inline(info.get("description", "")), "",
           "| method | path | summary | scope |", "|---|---|---|---|"]
    ops = list(operations(document))
    for op in ops:
        anchor = _slug(key, op.method, op.path)
        out.append(f"| {op.method} | [`{op.path}`](#{anchor}) | {_cell(op.summary)} | "
                   f"{_scopes(op.scopes) or 'none'} |")
    out.append("")
    for op in ops:
        out += [f"### {op.method} `{op.path}` {{#{_slug(key, op.method, op.path)}}}", "", _cell(op.summary) + ".", "",
                f"{'Scope' if len(op.scopes) == 1 else 'Scopes (all of them)'}: {_scopes(op.scopes)}." if op.scopes
                else "No token.", ""]
        if op.parameters:
            out += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
            for param in op.parameters:
                schema = param.get("schema", {})
                out.append(f"| `{param['name']}` | {param.get('in', '')} | {_type_md(key, schema)} | "
                           f"{'yes' if param.get('required') else ''} | {_cell(schema.get('description', ''))} |")
            out.append("")
        if op.body:
            out += [f"Body: {_link(key, op.body)} (JSON).", ""]
        out += ["| status | answer |", "|---|---|"]
        for status, description, shown in op.responses:
            body = f": {_link(key, shown) if shown and shown[:1].isupper() else '`' + shown + '`'}" if shown else ""
            out.append(f"| {status} | {_cell(description)}{body} |")
        out.append("")
    out += [f"### Schemas of the {title.lower()} {{#{key}-schemas}}", ""]
    for name, description, rows in schemas(document):
        out += [f"#### {name} {{#{key}-schema-{name.lower()}}}", ""]
        if description:
            out += [_cell(description), ""]
        if rows:
            out += ["| field | type | required | meaning | constraints |", "|---|---|---|---|---|"]
            for row in rows:
                out.append(f"| `{row['name']}` | {_type_words(key, row['type'])} | {'yes' if row['required'] else ''} "
                           f"| {_cell(row['description'])} | {_cell(row['constraints'])} |")
            out.append("")
    return out


def _scopes(scopes: tuple[str, ...]) -> str:
    return " and ".join(f"`{scope}`" for scope in scopes)


def _link(key: str, name: str) -> str:
    return f"[{name}](#{key}-schema-{name.lower()})"


def _type_md(key: str, schema: dict) -> str:
    return _type_words(key, type_of(schema))


def _type_words(key: str, text: str) -> str:
    words = []
    for word in text.split(" "):
        words.append(_link(key, word) if word[:1].isupper() and word.isidentifier() else _cell(word))
    return " ".join(words)


# ---- settings --------------------------------------------------------------------------------------

def settings_rows() -> list[dict]:
    """Every variable: name, setting (or None), default, used by, meaning, where it is read."""
    table = _settings_table(settings.__doc__ or "")
    rows = []
    for field in fields(settings.Settings):
        variable = settings.ENV_PREFIX + field.name.upper()
        if variable not in table:
            raise ValueError(f"api/settings.py: {variable} ({field.name}) is missing from the module docstring's table")
        used_by, meaning = table[variable]
        if field.name == "home":
            default = str(DEFAULT_HOME)
        elif field.default is MISSING or field.default is None:
            default = "unset"
        else:
            default = _shown(field.default)
        rows.append({"variable": variable, "setting": field.name, "default": default, "used_by": used_by,
                     "meaning": meaning, "read_in": "api/settings.py"})
    for variable, (default, used_by, meaning, read_in) in settings.READ_ELSEWHERE.items():
        rows.append({"variable": variable, "setting": None, "default": default, "used_by": used_by,
                     "meaning": meaning, "read_in": read_in})
    return rows


def _shown(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _settings_table(doc: str) -> dict[str, tuple[str, str]]:
    """variable -> (used by, meaning) from the docstring's fixed-width table of api/settings.py."""
    rows: dict[str, list] = {}
    current = None
    started = False
    for line in doc.splitlines():
        words = line.split()
        if not started:
            started = words[:2] == ["setting", "variable"]
            continue
        if not words:
            if current is not None:
                break  # the blank line after the table
            continue
        variable = next((w for w in words if w.startswith("PROVMARK_")), None)
        if variable is not None:
            after = words[words.index(variable) + 1:]
            used_by = after.pop() if after and after[-1] in SERVICES else ""
            current = rows[variable] = [used_by, after]
        elif current is not None and not (len(words) == 1 and words[0].isidentifier()):
            current[1].extend(words)  # a continuation line (a lone word is the next row's setting name)
    return {variable: (used_by, " ".join(meaning)) for variable, (used_by, meaning) in rows.items()}


def settings_page() -> str:
    rows = settings_rows()
    out = ["# Settings", "",
           "Every environment variable provmark reads, its default and what it changes. The services read "
           "theirs once, at start, through `api.settings.Settings` (a bad value stops the start with a message "
           "naming the variable); a value given to an app factory's `config` (the same name in lower case) "
           "takes precedence over the environment. This page is generated from `api/settings.py` by "
           "`docs/gen_reference.py` at every build of the site, and `tests/test_docs.py` checks that every "
           "`PROVMARK_*` name in the code is on it.", "",
           "## Service settings", "",
           "The fields of `Settings`. \"used by\": which service reads it.", "",
           "| variable | default | used by | meaning |", "|---|---|---|---|"]
    for row in rows:
        if row["setting"] is not None:
            meaning = row["meaning"]
            if meaning.startswith(row["default"] + ":"):  # the table's text often opens with the default
                meaning = meaning[len(row["default"]) + 1:].strip()
            out.append(f"| `{row['variable']}` | `{row['default']}` | {row['used_by']} | {_cell(meaning)} |")
    out += ["", "## Read elsewhere", "",
            "Variables read outside `Settings`, by the CLI as well as the services.", "",
            "| variable | default | used by | meaning | read in |", "|---|---|---|---|---|"]
    for row in rows:
        if row["setting"] is None:
            out.append(f"| `{row['variable']}` | `{row['default']}` | {_cell(row['used_by'])} | "
                       f"{_cell(row['meaning'])} | `{row['read_in']}` |")
    out.append("")
    return "\n".join(out)


PAGES = {"reference/cli.md": cli_page, "reference/http.md": http_page, "reference/settings.md": settings_page}


HEADER = ("<!-- Generated by docs/gen_reference.py from the code; do not edit by hand: `make docs` rewrites it, "
          "and tests/test_docs.py checks it. -->\n\n")


def pages() -> dict[str, str]:
    return {uri: HEADER + make() for uri, make in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the generated reference pages as files.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs",
                        help="folder to write reference/*.md into (default: docs)")
    args = parser.parse_args(argv)
    for uri, text in pages().items():
        path = args.out / uri
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
