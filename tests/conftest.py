"""Shared fixtures: tiny demo models, built once per machine into a test cache folder and
loaded once per test session; and the `slow` marker policy.

`python -m pytest -q` runs the fast suite: tests marked `slow` (benchmark smoke runs, tutorial
scripts, the page screenshot, long exactness sweeps) are deselected unless `--slow` is given or
an explicit `-m` expression chooses. `.ci/run` passes `--slow`, so CI runs everything.
"""

import os
import tempfile

import pytest

# Keep test models out of the user's cache, but share them across test runs on this machine.
os.environ.setdefault("FORKV_CACHE_DIR", os.path.join(tempfile.gettempdir(), "forkv-test-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from forkv.engine import blas  # noqa: E402

blas.activate()  # before any test imports mlx, as an application would

ARCHS = ("qwen3", "gemma3", "gemma4", "qwen3_5")

_loaded = {}


def load_tiny(arch: str, dtype: str = "float32"):
    from forkv.engine import load_model

    key = (arch, dtype)
    if key not in _loaded:
        _loaded[key] = load_model(f"demo:{arch}:tiny", dtype=dtype)
    return _loaded[key]


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (.ci/run does)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow") or config.getoption("markexpr"):
        return  # --slow runs everything; an explicit -m expression decides for itself
    fast = [item for item in items if "slow" not in item.keywords]
    if len(fast) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if "slow" in i.keywords])
        items[:] = fast
