"""The documentation: the site builds in strict mode (a broken link or anchor fails), the generated reference
pages are what the code generates now, and the README, the settings reference and the code agree on every
``PROVMARK_*`` variable and its default."""

import importlib.util
import os
import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "db", "detector", "evaluation", "generation", "provenance", "watermark")
VARIABLE = re.compile(r"\b(PROVMARK_[A-Z][A-Z0-9_]*|PROMETHEUS_MULTIPROC_DIR)\b")


@pytest.fixture(scope="module")
def gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(gen_reference):
    return {row["variable"]: row for row in gen_reference.settings_rows()}


def test_the_site_builds_in_strict_mode(tmp_path, monkeypatch):
    """mkdocs.yml sets strict and turns every link, anchor and nav check into a warning: any one fails here."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    monkeypatch.chdir(ROOT)
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"))
    assert config.strict
    try:
        build(config)
    except Abort as error:  # the warnings themselves are in the captured log above
        pytest.fail(f"the documentation site does not build in strict mode: {error}")
    site = tmp_path / "site"
    for page in ("index.html", "tutorial/getting-started.html", "how-to/make-a-verdict-surer.html",
                 "reference/cli.html", "reference/http.html", "reference/settings.html", "research/index.html",
                 "how-to/troubleshooting.html", "explanation/receiving-a-verdict.html"):
        assert (site / page).is_file(), page
    surer = (site / "how-to" / "make-a-verdict-surer.html").read_text()
    assert "keys calibrate --corpus" in surer
    tutorial = (site / "tutorial" / "getting-started.html").read_text()
    assert "paste-page.png" in tutorial and (site / "img" / "paste-page.png").is_file()
    assert "--scopes detect" in tutorial  # the paste page needs a token: the tutorial says how to get one


def test_the_committed_reference_pages_are_what_the_code_generates(gen_reference):
    """docs/reference/{cli,http,settings}.md are generated; a change to the CLI, a route or a setting must come
    with the regenerated pages (`make docs`, or `python docs/gen_reference.py`)."""
    stale = [uri for uri, text in gen_reference.pages().items()
             if (ROOT / "docs" / uri).read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated pages {stale}: run `python docs/gen_reference.py` (or `make docs`) and commit"


def test_the_cli_reference_names_every_command_and_option(gen_reference):
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    commands = gen_reference.cli_commands()
    assert {" ".join(path) for path, _, _ in commands} >= {"provmark keys calibrate", "provmark detect",
                                                           "provmark receipts verify", "provmark serve"}
    for path, parser, _ in commands:
        assert f"`{' '.join(path)}`" in page
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page, (path, option)


def test_the_http_reference_names_every_route_of_both_services(gen_reference):
    page = (ROOT / "docs" / "reference" / "http.md").read_text(encoding="utf-8")
    for document in (gen_reference.detector_document(), gen_reference.generation_document()):
        for path, methods in document["paths"].items():
            for method in methods:
                assert f"### {method.upper()} `{path}`" in page
    assert "/v1/detect" in page and "/v1/chat/completions" in page


def _variables_in_code() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in VARIABLE.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_variable_the_code_reads_is_in_the_settings_reference(rows):
    from api.settings import ENV_PREFIX, Settings

    documented = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    in_code = _variables_in_code()
    in_code.update({ENV_PREFIX + f.name.upper(): ["api/settings.py"] for f in fields(Settings)})  # read by name
    missing = {name: where[:3] for name, where in in_code.items() if name not in rows}
    assert not missing, ("variables read by the code but missing from the settings reference: add a Settings field "
                         f"with its docstring row, or an entry of api/settings.py's READ_ELSEWHERE: {missing}")
    for name in in_code:
        assert f"`{name}`" in documented, name
    stale = sorted(set(rows) - set(in_code))
    assert not stale, f"the settings reference names variables no code reads: {stale}"


def _readme_table() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].strip("`").isupper():
            table[cells[0].strip("`")] = cells[1].strip("`")
    return table


def test_the_readme_table_agrees_with_the_code(rows):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = _readme_table()
    assert len(table) >= 5
    for name, default in table.items():
        assert name in rows, f"README names {name}, which no code reads"
        assert default == rows[name]["default"], f"README: {name} defaults to {default!r}, the code to " \
                                                 f"{rows[name]['default']!r}"
    assert "docs/reference/settings.md" in readme
    assert "lists every one" not in readme


def test_defaults_read_outside_settings_are_the_code_s(rows, monkeypatch, tmp_path):
    from watermark import native_build, paths

    for name in ("PROVMARK_MODELS_DIR", "PROVMARK_KERNEL_DIR", "PROVMARK_NATIVE", "PROVMARK_COMPILE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROVMARK_HOME", str(tmp_path / "home"))
    assert paths.models_dir() == tmp_path / "home" / "models"
    assert rows["PROVMARK_MODELS_DIR"]["default"] == "$PROVMARK_HOME/models"
    assert native_build.kernel_dir() == Path(rows["PROVMARK_KERNEL_DIR"]["default"]).expanduser()
    assert not native_build.native_disabled() and rows["PROVMARK_NATIVE"]["default"] == "1"
    greenlist = (ROOT / "watermark" / "greenlist.py").read_text(encoding="utf-8")
    assert 'os.environ.get("PROVMARK_COMPILE", "1")' in greenlist and rows["PROVMARK_COMPILE"]["default"] == "1"
    assert str(paths.DEFAULT_HOME) == rows["PROVMARK_HOME"]["default"]


def test_the_readme_links_to_files_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, missing


def test_no_file_cites_a_document_that_is_not_in_the_repository():
    names = ["FACTS", "ARCHITECTURE", "STYLE"]  # written apart, so this file does not cite them either
    pattern = "|".join(re.escape(name + ".md") for name in names)
    found = subprocess.run(["git", "grep", "-n", "-E", pattern], cwd=ROOT, capture_output=True, text=True)
    if found.returncode not in (0, 1):  # not a git checkout: nothing to check
        pytest.skip("not a git checkout")
    hits = [line for line in found.stdout.splitlines() if not line.startswith("tests/test_docs.py:")]
    absent = [line for line in hits
              if not any((ROOT / m).exists() for m in re.findall(r"[\w/]*(?:" + pattern + ")", line))]
    assert not absent, absent


def test_every_docs_page_is_in_the_nav():
    """mkdocs' omitted-files check, stated here too: a page outside the nav is a page nobody finds."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert pages and all(page in nav for page in pages), [page for page in pages if page not in nav]


def test_os_environ_is_left_as_it_was(gen_reference):
    before = dict(os.environ)
    gen_reference.cli_page()
    assert dict(os.environ) == before


def test_a_route_needing_two_scopes_names_both(gen_reference):
    """``x-required-scope`` is one name or a list a token must all hold; the reference and /docs name each."""
    from api.api_page import _operation_html, operations

    document = {"paths": {"/v1/x": {"get": {"summary": "x", "x-required-scope": ["audit", "explain"]}},
                          "/v1/y": {"get": {"summary": "y", "x-required-scope": "detect"}},
                          "/v1/z": {"get": {"summary": "z"}}}}
    x, y, z = operations(document)
    assert (x.scopes, y.scopes, z.scopes) == (("audit", "explain"), ("detect",), ())
    assert "<code>audit</code> and <code>explain</code>" in _operation_html(x)
    page = "\n".join(gen_reference._service_section("t", "T", document))
    assert "Scopes (all of them): `audit` and `explain`." in page and "Scope: `detect`." in page
    assert "| `audit` and `explain` |" in page and "No token." in page


def test_the_inclusion_proof_route_names_both_scopes_it_needs():
    page = (ROOT / "docs" / "reference" / "http.md").read_text(encoding="utf-8")
    section = page.split("### GET `/v1/log/proof/inclusion`", 1)[1].split("\n### ", 1)[0]
    assert "`audit` and `explain`" in section
    consistency = page.split("### GET `/v1/log/proof/consistency`", 1)[1].split("\n### ", 1)[0]
    assert "`audit`" not in consistency  # a witness needs no token


HISTORY = re.compile(r"[Ii]ssue #[0-9]|\(#[0-9]+[),]|, #[0-9]+\)|the 2-core box")


def test_no_file_cites_a_tracker_issue():
    """Comments and pages say why a thing is so, never which tracker issue asked for it."""
    found = subprocess.run(["git", "grep", "-n", "-I", "-E", HISTORY.pattern], cwd=ROOT, capture_output=True, text=True)
    if found.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    # the scheme refactor rewrites these two modules' docstrings; drop them from here with it
    pending = ("tests/test_docs.py:",)
    hits = [line for line in found.stdout.splitlines() if not line.startswith(pending)]
    assert not hits, hits
