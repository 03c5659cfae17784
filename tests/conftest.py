import os

import pytest
import torch

import qbackend
from qbackend import probe, registry


@pytest.fixture(autouse=True)
def _clean_selection_env(monkeypatch):
    """Each test starts with no overrides and a fresh registry (env is read at registry creation)."""
    for var in ("QBACKEND_PROVIDER", "QBACKEND_DISABLE", "QBACKEND_SIMULATE",
                "QBACKEND_DISABLE_PLUGIN_AUTOLOAD", "QBACKEND_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    registry.reload()
    yield
    registry._registry = None  # rebuilt lazily, after monkeypatch restores the environment
    probe.reset()


@pytest.fixture
def gen():
    """A fresh random generator per test, seeded from the OS: every run draws new inputs."""
    g = torch.Generator()
    g.seed()
    return g


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return f"qbackend {qbackend.__version__}, torch {torch.__version__}, " \
           f"simulate={os.environ.get('QBACKEND_SIMULATE', '-')}"
