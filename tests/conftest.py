"""Shared test environment: one persistent converted-model cache, a private state folder per test."""

import os
from pathlib import Path

import pytest

# The suite shares 2 cores with the servers it starts: spinning OpenMP threads would stall each
# other (measured: 10 -> 0.7 tokens/s at batch 1), so idle threads sleep. Must precede `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Set before any provmark import reads it, so repeated runs reuse one converted model.
os.environ.setdefault("PROVMARK_MODELS_DIR", str(Path(__file__).resolve().parent.parent / ".cache" / "models"))


@pytest.fixture(autouse=True)
def provmark_home(tmp_path, monkeypatch):
    """Each test gets its own PROVMARK_HOME (keyring, database)."""
    home = tmp_path / "provmark-home"
    monkeypatch.setenv("PROVMARK_HOME", str(home))
    return home
