"""The notebooks run top to bottom without an error (executed with nbclient, small sizes).

The kernel is this interpreter's ipykernel, through a kernel spec written into a temporary
JUPYTER_PATH folder: a user-wide "python3" kernel spec pointing at another Python cannot be picked up.
Each notebook makes its own temporary PROVMARK_HOME; the test's private home is passed too.
"""

import json
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL_NAME = "provmark-test-kernel"
CELL_TIMEOUT = 300  # seconds for one cell (the robustness run is the longest: ~1 min on 2 busy cores)


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "provmark test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOKS.parent))  # the kernel imports the project from the checkout
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["01_quickstart.ipynb", "02_robustness.ipynb", "03_audit.ipynb"])
def test_notebook_runs_without_errors(name, kernel_env):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(notebook, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(kernel_env)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code_cells)
    errors = [o for c in code_cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # nothing the notebook printed carries a key's secret: only ids and fingerprints are shown
    printed = "".join(o.get("text", "") for c in code_cells for o in c.get("outputs", []))
    assert "secret" not in printed.lower()
