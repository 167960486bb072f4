"""The import contracts in pyproject.toml ([tool.importlinter]) hold: the layers api -> evaluation ->
(generation | detector) -> db -> watermark, the generation service without the detector, and no import
cycle between the modules of any package. ``lint-imports`` (import-linter) checks them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_lint_imports_keeps_every_contract():
    # PYTHONPATH: the packages of this checkout, not whatever an installed copy points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout and "3 kept" in result.stdout, result.stdout[-2000:]
