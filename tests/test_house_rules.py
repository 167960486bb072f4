"""House rules of the code, kept by CI: a watermark scheme lives in one place (no list of scheme kinds and no
``isinstance`` switch over spec types outside the registry ``watermark/schemes/``), and no function of the
product packages takes more than 8 parameters (options that belong together are one object)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("api", "watermark", "detector", "generation", "db", "provenance", "evaluation")
REGISTRY = "watermark/schemes/"  # the one place that may name scheme families and switch over their types
MAX_PARAMETERS = 8  # self / cls not counted; *args and **kwargs count one each
# functions allowed past MAX_PARAMETERS, each with its reason
PARAMETER_EXCEPTIONS = {
    "generation/cpu/native.py:watermark_bias": "the C kernel's entry point, argument for argument; it runs once "
                                               "a decode step and packs nothing",
    "generation/cpu/paged_native.py:rope_cache_attention": "the C kernel's entry point, argument for argument; it "
                                                           "runs once a layer a decode step",
    "db/receipts.py:sign_receipt": "keyword-only, one keyword per signed field of the receipt",
    "api/http.py:route": "keyword-only, one keyword per field of the OpenAPI operation it documents",
}
# the scheme families' names, as spec prefixes and as ``spec.kind`` values (old spellings included)
FAMILY_NAMES = frozenset({"kgw", "hf", "gumbel", "synthid", "hf-synthid", "hf:synthid", "vllm-gumbel", "vllm:gumbel"})
# the spec and watermark types of the families: an isinstance over one of them is a switch over schemes
SCHEME_TYPES = frozenset({"WatermarkSpec", "GumbelSpec", "SynthIDSpec", "HFSynthIDSpec", "VLLMGumbelSpec",
                          "SAMPLING_SPEC_TYPES", "SamplingSpec", "GumbelWatermark", "SynthIDWatermark", "HFSynthID",
                          "VLLMGumbel"})


def product_files() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (REPO / package).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [f"*{args.vararg.arg}"] if args.vararg else []
    names += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return [name for name in names if name not in ("self", "cls")]


def long_signatures() -> dict[str, int]:
    found = {}
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > MAX_PARAMETERS:
                found[f"{relative(path)}:{node.name}"] = len(parameters(node))
    return found


def _family_strings(node: ast.AST) -> list[str]:
    elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [e.value for e in elements if isinstance(e, ast.Constant) and e.value in FAMILY_NAMES]


def _type_guards(tree: ast.AST) -> set[int]:
    """``if not isinstance(x, T): raise ...``: a constructor refusing a wrong argument, not a switch."""
    return {id(node.test.operand) for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
            and isinstance(node.test.operand, ast.Call) and not node.orelse
            and len(node.body) == 1 and isinstance(node.body[0], ast.Raise)}


def scheme_switches(path: Path) -> list[str]:
    """Where a module outside the registry lists scheme kinds, compares a kind with a family's name, or switches
    on a spec's type: 'line: what'."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guards = _type_guards(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and _family_strings(node):
            found.append(f"{node.lineno}: a list of scheme kinds {_family_strings(node)}")
        elif isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in FAMILY_NAMES
                                                   for c in (node.left, *node.comparators)):
            found.append(f"{node.lineno}: a kind compared with a family's name")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
              and len(node.args) == 2 and id(node) not in guards):
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & SCHEME_TYPES:
                found.append(f"{node.lineno}: isinstance over {sorted(named & SCHEME_TYPES)}")
    return found


def test_no_product_function_takes_more_than_8_parameters():
    found = long_signatures()
    over = {name: count for name, count in found.items() if name not in PARAMETER_EXCEPTIONS}
    assert over == {}, f"group options that belong together into one object: {over}"
    stale = set(PARAMETER_EXCEPTIONS) - set(found)
    assert not stale, f"no longer over {MAX_PARAMETERS} parameters: drop their exceptions {sorted(stale)}"


def test_schemes_are_named_and_switched_on_only_in_the_registry():
    found = {relative(path): hits for path in product_files()
             if not relative(path).startswith(REGISTRY) and (hits := scheme_switches(path))}
    assert found == {}, ("a scheme family is one module of watermark/schemes/ and one registry line; ask the "
                         f"registry (watermark.schemes.family_of) instead: {found}")


def test_the_checks_see_what_they_forbid(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("KINDS = ('gumbel', 'synthid')\n"
                      "def f(spec, a, b, c, d, e, g, h, i):\n"
                      "    if isinstance(spec, GumbelSpec) or spec.kind == 'kgw':\n"
                      "        return 1\n", encoding="utf-8")
    hits = scheme_switches(sample)
    assert [hit.split(":")[0] for hit in hits] == ["1", "3", "3"]
    function = next(n for n in ast.walk(ast.parse(sample.read_text())) if isinstance(n, ast.FunctionDef))
    assert len(parameters(function)) == 9
