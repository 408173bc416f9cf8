"""Shared fixtures: tiny demo models, built once per machine into a test cache folder."""

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
