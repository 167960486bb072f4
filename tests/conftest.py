"""Shared test environment: one persistent converted-model cache, a private state folder per test."""

import os
from pathlib import Path

import pytest

# The suite shares 2 cores with the servers it starts: spinning OpenMP threads would stall each
# other (measured: 10 -> 0.7 tokens/s at batch 1), so idle threads sleep. Must precede `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Under pytest-xdist (``make test`` runs one worker per core) each worker, and the servers it starts,
# computes on one thread: two workers with two threads each would oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Set before any provmark import reads it, so repeated runs reuse one converted model.
os.environ.setdefault("PROVMARK_MODELS_DIR", str(Path(__file__).resolve().parent.parent / ".cache" / "models"))


@pytest.fixture(autouse=True)
def provmark_home(tmp_path, monkeypatch):
    """Each test gets its own PROVMARK_HOME (keyring, database)."""
    home = tmp_path / "provmark-home"
    monkeypatch.setenv("PROVMARK_HOME", str(home))
    return home


@pytest.fixture
def home_store(provmark_home):
    """The SQLite store of this test's home (where a single-machine install keeps everything)."""
    from db.store import Store

    store = Store(home=provmark_home)
    yield store
    store.close()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module's model-running tests: exactness does not depend on it, and on a
    shared 2-core runner two spinning OpenMP threads stall each other (0.7 vs 10 tokens/s measured), so
    runtime stays bounded. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def loaded():
    """The embedded default model, loaded once for the whole run (engines wrap it; none modifies it)."""
    from generation.models import load_model

    return load_model()


FIXED_SECRET = bytes.fromhex("5d6f0c2a9e41b7d38c15f0a4e26b9d7153c8e0fa4b2d961e7a3c5f08d1e4b62c")


@pytest.fixture
def fixed_key(provmark_home):
    """The active key of this test's keyring, from a fixed secret: a test that asserts detection of a
    few sampled texts is then deterministic (seeds and key fixed), where a random key per run made it
    fail now and then on a text that fell into a repetitive loop. Returns the key id."""
    from watermark.keys import Keyring

    return Keyring().create("k-fixed", secret=FIXED_SECRET).key_id


@pytest.fixture
def keyring(provmark_home):
    """A keyring in this test's home: "alpha" (active) and "beta" (standby). Modules may define their own."""
    from watermark.keys import Keyring

    ring = Keyring()
    ring.create("alpha")
    ring.create("beta")
    return ring
