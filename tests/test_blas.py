"""Tests for forkv.engine.models.blas.

Interposition only works before mlx is first imported, so every check runs in a fresh
interpreter; the shim is built into a per-test cache folder. Correctness only, never speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from forkv.engine.models import blas

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="BLAS interposition is Linux-only")

# Activates `argv[1]` (or FORKV_BLAS), then checks a float32 matmul and a LAPACK call vs numpy.
_CHECK = """
import json, sys, numpy as np
from forkv.engine.models import blas
info = blas.activate(sys.argv[1] if len(sys.argv) > 1 else None)
import mlx.core as mx
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 192), dtype=np.float32)
b = rng.standard_normal((192, 128), dtype=np.float32)
got = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))
s = a[:64, :64] @ a[:64, :64].T + 64 * np.eye(64, dtype=np.float32)
inv = np.array(mx.linalg.inv(mx.array(s), stream=mx.cpu))
print(json.dumps({
    "name": info.name, "is_optimized": info.is_optimized, "reason": info.reason,
    "provider": blas._provider_of("cblas_sgemm"),
    "mm_err": float(np.abs(got - a @ b).max()),
    "inv_err": float(np.abs(inv @ s - np.eye(64)).max()),
}))
"""


def _check(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k != "FORKV_BLAS"}
    full_env |= {"FORKV_CACHE_DIR": str(tmp_path)} | (env or {})
    run = subprocess.run(
        [sys.executable, "-c", _CHECK, *args],
        capture_output=True, text=True, env=full_env, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _assert_correct(result: dict) -> None:
    assert result["mm_err"] < 1e-3, result
    assert result["inv_err"] < 1e-3, result


def test_auto_uses_an_optimized_blas_when_present(tmp_path):
    result = _check(tmp_path, "auto")
    if not result["is_optimized"]:
        pytest.skip(f"no optimized BLAS here: {result['reason']}")
    assert result["name"] != "stock"
    assert result["provider"] is not None  # mlx binds cblas_sgemm from the global scope
    _assert_correct(result)


@pytest.mark.parametrize("finder", ["_find_scipy_openblas32", "_find_numpy_openblas"])
def test_shim_forwards_prefixed_openblas(tmp_path, finder):
    lib = getattr(blas, finder)()
    if lib is None or shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("prefixed OpenBLAS or C compiler not available")
    result = _check(tmp_path, str(lib))
    assert result["is_optimized"] and result["name"].endswith("+shim"), result
    assert Path(result["provider"]).parent == tmp_path / "blas"
    _assert_correct(result)


def test_off_keeps_stock_blas(tmp_path):
    result = _check(tmp_path, env={"FORKV_BLAS": "off"})
    assert result["name"] == "stock" and not result["is_optimized"]
    assert result["provider"] is None
    assert "off" in result["reason"]
    _assert_correct(result)


def test_bogus_path_falls_back_to_stock_with_reason(tmp_path):
    result = _check(tmp_path, "/nonexistent/libnoblas.so")
    assert result["name"] == "stock" and result["provider"] is None
    assert "/nonexistent/libnoblas.so" in result["reason"] and "cannot load" in result["reason"]
    _assert_correct(result)


def test_library_without_cblas_falls_back_to_stock(tmp_path):
    result = _check(tmp_path, "libm.so.6")
    assert result["name"] == "stock"
    assert "exports neither" in result["reason"]


def test_activation_after_mlx_import_warns(tmp_path):
    code = ("import mlx.core; from forkv.engine.models import blas; "
            "print(blas.activate('auto').name)")
    env = os.environ | {"FORKV_CACHE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-W", "always", "-c", code]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    assert "RuntimeWarning" in run.stderr and "before" in run.stderr
    assert run.stdout.strip() == "stock"


def test_forkv_modules_import_without_mlx():
    # An application imports forkv, then loads a model (which binds the BLAS shim, then mlx):
    # a module of the engine, server or CLI that imported mlx at import time would leave mlx
    # on its stock BLAS (the ahead-decode module once did, through speculate.py).
    code = ("import sys, forkv, forkv.engine.engine, forkv.engine.request.scheduler, "
            "forkv.server, forkv.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shim_covers_what_mlx_imports():
    """If mlx starts importing more BLAS/LAPACK, extend _CBLAS/_LAPACK (else those stay stock)."""
    spec = importlib.util.find_spec("mlx")  # locate without importing: keeps this process clean
    mlx_lib = Path(spec.submodule_search_locations[0]) / "lib" / "libmlx.so" if spec else None
    if mlx_lib is None or not mlx_lib.exists() or shutil.which("nm") is None:
        pytest.skip("libmlx.so or nm not found")
    out = subprocess.run(["nm", "-D", "--undefined-only", str(mlx_lib)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    wanted = {n for n in names if n.startswith("cblas_") or re.fullmatch(r"[sdcz][a-z]{3,5}_", n)}
    assert wanted, "found no BLAS imports; has mlx changed how it links BLAS?"
    assert wanted <= set(blas._CBLAS) | set(blas._LAPACK)


def test_shim_source_shapes():
    lp64, ilp64 = blas._shim_source(ilp64=False), blas._shim_source(ilp64=True)
    assert "void sgetrf_(" in lp64 and "void sgetrf_(" not in ilp64  # ILP64 leaves LAPACK stock
    assert "long long m" in ilp64 and "long long" not in lp64


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
@pytest.mark.parametrize("what", ["folder", "file"])
def test_a_shim_another_user_could_plant_is_never_loaded(tmp_path, what):
    """The shim folder (or a shim in it) owned by someone else, or writable by others: forkv
    refuses to dlopen it and keeps stock BLAS, saying why."""
    lib = blas._find_scipy_openblas32()
    if lib is None or os.geteuid() != 0:
        pytest.skip("needs the scipy OpenBLAS wheel, and root to hand files to another user")
    first = _check(tmp_path, str(lib))  # builds the shim into tmp_path/blas
    shim = Path(first["provider"])
    target = shim.parent if what == "folder" else shim
    os.chown(target, 4242, 4242)
    result = _check(tmp_path, str(lib))
    assert not result["is_optimized"] and "not private to you" in result["reason"], result
    os.chown(target, os.geteuid(), os.getegid())
    os.chmod(target, 0o777 if what == "folder" else 0o666)
    result = _check(tmp_path, str(lib))
    assert not result["is_optimized"] and "not private to you" in result["reason"], result
    _assert_correct(result)


_SAME_UNDER_THREADS = """
import sys, threading
import numpy as np
from forkv.engine.models import blas
assert blas.activate().name != "stock", blas.status()
import mlx.core as mx
rng = np.random.default_rng(0)
# K = 1030: a shape whose OpenBLAS result depends on its thread count (attention over a
# context); the small one runs on one thread. Each thread's result must not depend on what
# the other is doing at the time.
big = [mx.array(rng.standard_normal(s, dtype=np.float32)) for s in ((300, 1030), (1030, 640))]
small = [mx.array(rng.standard_normal(s, dtype=np.float32)) for s in ((1, 640), (640, 640))]
alone = np.array(big[0] @ big[1])
results, stop = [], threading.Event()

def busy_small():
    s = mx.new_stream(mx.cpu)
    while not stop.is_set():
        mx.eval(mx.matmul(*small, stream=s))

t = threading.Thread(target=busy_small)
t.start()
for _ in range(40):
    results.append(np.array(big[0] @ big[1]))
stop.set()
t.join()
print(sum(not np.array_equal(r, alone) for r in results))
"""


def test_a_matmul_gives_the_same_bits_while_another_thread_runs_small_ones():
    out = subprocess.run([sys.executable, "-c", _SAME_UNDER_THREADS], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0", out.stdout
