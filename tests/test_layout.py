"""The layout rules, kept by CI: ruff's findings ([tool.ruff] in pyproject.toml), the size of a module, imports of
the project's own packages inside functions, and no citation of a document the repository does not hold.

What is not the product is left out of the size and import rules: tests, benchmarks, scripts, experiments
(research/), notebooks and docs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).with_name("ruff")
# the shipped packages and research/ (its scripts are held to the same rules: they are read as the project's code)
NOT_PRODUCT = ("tests/", "benchmarks/", "scripts/", "notebooks/", "docs/")
OWN_PACKAGES = frozenset({"api", "evaluation", "generation", "detector", "db", "provenance", "watermark", "research"})
MAX_MODULE_LINES = 400
MAX_LOCAL_OWN_IMPORTS = 14  # fails at 15: each one left keeps a heavy dependency out of a start-up path
# documents that were never in the repository; spelled in parts so this file does not cite them itself
ABSENT_DOCUMENTS = tuple(f"{stem}.md".encode() for stem in ("FACTS", "ARCHITECTURE", "STYLE"))


def tracked_files() -> list[str]:
    """Every file of the checkout git tracks, relative to the repository root (without git: every file outside
    hidden folders, virtual environments and caches)."""
    try:
        result = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(path.relative_to(REPO)) for path in REPO.rglob("*") if path.is_file()
                      and not any(part.startswith(".") or part == "__pycache__" or part.endswith(".egg-info")
                                  for part in path.relative_to(REPO).parts))
    return [name for name in result.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def product_modules() -> list[str]:
    return [name for name in tracked_files() if name.endswith(".py") and not name.startswith(NOT_PRODUCT)]


def local_own_imports(source: str) -> list[int]:
    """Line numbers of the imports of the project's own packages (or relative ones) inside functions."""
    lines = set()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in OWN_PACKAGES for a in node.names):
                lines.add(node.lineno)
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in OWN_PACKAGES):
                lines.add(node.lineno)
    return sorted(lines)


def test_ruff_finds_nothing():
    result = subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_no_module_is_longer_than_the_limit():
    sizes = {name: len((REPO / name).read_text(encoding="utf-8").splitlines()) for name in product_modules()}
    long = {name: n for name, n in sorted(sizes.items()) if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {long}"


def test_few_imports_of_our_own_packages_inside_functions():
    found = [f"{name}:{line}" for name in product_modules()
             for line in local_own_imports((REPO / name).read_text(encoding="utf-8"))]
    print(f"{len(found)} function-local imports of the project's own packages:", *found, sep="\n  ")
    assert len(found) <= MAX_LOCAL_OWN_IMPORTS, (
        f"{len(found)} function-local imports of our own packages (at most {MAX_LOCAL_OWN_IMPORTS}; import at the "
        "top unless it keeps a heavy dependency out of a start-up path): " + ", ".join(found))


def test_no_file_cites_a_document_the_repository_does_not_hold():
    citing = {name for name in tracked_files()
              if any(document in (REPO / name).read_bytes() for document in ABSENT_DOCUMENTS)}
    names = ", ".join(document.decode() for document in ABSENT_DOCUMENTS)
    assert not citing, f"these files cite {names}, which are not in the repository: {sorted(citing)}"
