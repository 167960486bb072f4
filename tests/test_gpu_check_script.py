"""benchmarks/gpu_check.sh, which nobody can run here (no GPU): valid bash, strict mode, every file it names
exists, every step under `timeout`, and the limits fit the 8 minutes it promises."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
BUDGET_S = 8 * 60
INSTALL_LIMIT = re.compile(r"timeout (\d+) make install")


def script_text() -> str:
    return SCRIPT.read_text(encoding="utf-8")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_the_script_runs_in_strict_mode():
    lines = [line for line in script_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0] == "set -euo pipefail"  # before any command


def test_every_file_the_script_names_exists():
    named = set(re.findall(r"\b((?:tests|benchmarks|generation)/[\w/.-]+\.(?:py|sh))\b", script_text()))
    assert {"tests/test_gpu_cuda.py", "tests/test_gpu_path.py", "benchmarks/engine_throughput.py"} <= named
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, missing
    assert "--device cuda" in script_text()
    assert re.search(r'parser\.add_argument\("--device"', (ROOT / "benchmarks/engine_throughput.py").read_text())


def test_every_step_runs_under_a_timeout_within_the_budget():
    commands = [line.strip() for line in script_text().splitlines()
                if re.search(r'"\$PY"|nvidia-smi -L|make install', line) and not line.lstrip().startswith("#")]
    commands = [c for c in commands if not c.startswith(("PY=", "elif", "if "))]
    assert commands and all(c.startswith("timeout ") for c in commands), commands
    limits = [int(m) for m in re.findall(r"^\s*timeout (\d+) ", script_text(), flags=re.MULTILINE)]
    install = [int(m) for m in INSTALL_LIMIT.findall(script_text())]
    assert sum(limits) - sum(install) <= BUDGET_S
