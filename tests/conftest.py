"""Shared fixtures: tiny demo models, built once per machine into a test cache folder and
loaded once per test session; and the `slow` marker policy.

`python -m pytest -q` runs the fast suite: tests marked `slow` (benchmark smoke runs, tutorial
scripts, the page screenshot, long exactness sweeps) are deselected unless `--slow` is given or
an explicit `-m` expression chooses. `.ci/run` passes `--slow`, so CI runs everything.
"""

import os
import shutil
import tempfile

import pytest

# Keep test models out of the user's cache, but share them across test runs on this machine.
_USER_CACHE = os.environ.get("FORKV_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forkv")
os.environ.setdefault("FORKV_CACHE_DIR", os.path.join(tempfile.gettempdir(), "forkv-test-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _share_pulled_files() -> None:
    """Hard-link the named models' files that `forkv pull` fetched into the user's cache (e.g.
    smollm2-135m's GGUF) into the test cache: the tests never download, but use what is here."""
    src = os.path.join(_USER_CACHE, "named", "files")
    dst = os.path.join(os.environ["FORKV_CACHE_DIR"], "named", "files")
    if os.path.realpath(src) == os.path.realpath(dst) or not os.path.isdir(src):
        return
    for release in os.listdir(src):
        for name in os.listdir(os.path.join(src, release)):
            target = os.path.join(dst, release, name)
            if name.startswith(".") or os.path.exists(target):
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            for folder in (os.path.dirname(dst), dst, os.path.dirname(target)):
                os.chmod(folder, 0o700)  # forkv refuses cache folders open to others
            try:
                os.link(os.path.join(src, release, name), target)
            except OSError:
                pass  # another file system: the tests that need it skip


_share_pulled_files()

from forkv.engine.models import blas  # noqa: E402

blas.activate()  # before any test imports mlx, as an application would

ARCHS = ("qwen3", "gemma3", "gemma4", "qwen3_5")

_loaded = {}


def load_tiny(arch: str, dtype: str = "float32", kv_dtype: str = "auto"):
    from forkv.engine import load_model

    key = (arch, dtype, kv_dtype)
    if key not in _loaded:
        _loaded[key] = load_model(f"demo:{arch}:tiny", dtype=dtype, kv_dtype=kv_dtype)
    return _loaded[key]


# Where a test compares two chunkings (or row batchings) within a tolerance: BLAS may sum a
# matmul of more rows otherwise (OpenBLAS's Haswell kernels do), and half-width K/V turn such a
# last-bit difference into a float16 step now and then, which a random model amplifies (~3e-3
# on Gemma 3's demo). Those tests compare over float32 K/V; exactness under the default K/V,
# with the same chunking, is tested bit for bit elsewhere.
TOLERANCE_KV = "float32"


def mlx_lm_model(name: str):
    """A demo model as mlx-lm's own `load` gives it (float32 as saved), before forkv's loader
    moves a float32 model's attention, norms and activations onto its kernels."""
    from mlx_lm import load

    from forkv.engine.models.loader import resolve_model_path

    return load(str(resolve_model_path(name)))[0]


@pytest.fixture(scope="module")
def lib():
    """forkv's kernels (engine/native), their best ISA set again after the module's tests;
    a skip where they are turned off or cannot build, a failure where they should build."""
    from forkv.engine import native

    module = native.load()
    if module is None:
        if "FORKV_NATIVE=off" in native.status().reason:
            pytest.skip("forkv's kernels are turned off (FORKV_NATIVE=off)")
        if shutil.which("cmake") and shutil.which("c++"):
            pytest.fail(f"the kernels should build on this machine: {native.status().reason}")
        pytest.skip(f"forkv's kernels are not available: {native.status().reason}")
    yield module
    module.set_isa(module.best_isa())


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


_scoped_engines = []


def scoped_engine(*args, **kw):
    """`Engine(*args, **kw)`, closed when the test that made it ends, however it ends (its
    thread stopped, its store's files removed). Not for engines shared beyond one test."""
    from forkv.engine import Engine

    engine = Engine(*args, **kw)
    _scoped_engines.append(engine)
    return engine


@pytest.fixture(autouse=True)
def _close_scoped_engines():
    yield
    while _scoped_engines:
        _scoped_engines.pop().close()


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
