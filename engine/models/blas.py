"""Put an optimized BLAS under mlx's CPU backend; call `activate()` before mlx is imported.

The Linux CPU wheel of mlx links its own reference BLAS/LAPACK (``mlx_cpu.libs``) and imports
``cblas_sgemm``/``cblas_dgemm``/``cblas_cgemm`` plus 21 LAPACK routines by name. Python loads
mlx with RTLD_LOCAL, so a library loaded earlier with RTLD_GLOBAL wins symbol lookup: that is
the whole trick. Only float32/float64/complex64 matmul benefits; bfloat16 never reaches BLAS.

``auto`` tries, in order: the system OpenBLAS (Debian ``libopenblas0-pthread``), MKL
(``libmkl_rt``), the ``scipy-openblas32`` wheel, then the OpenBLAS inside numpy's wheel. The
wheels prefix their symbols (``scipy_cblas_sgemm``), so a small forwarding shim is compiled
once with ``cc`` into ``$FORKV_CACHE_DIR/blas`` (default ``~/.cache/forkv/blas``). Nothing here
raises on a missing or broken library: the result is ``stock`` with a reason. This module does
not choose dtypes or devices.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import blas_threads

__all__ = ["BlasInfo", "activate", "kernel_label", "measure_gflops", "status"]


@dataclass(slots=True)
class BlasInfo:
    """Which BLAS mlx's CPU matmul uses.

    name: 'openblas-system', 'mkl', 'scipy-openblas32+shim', 'scipy-openblas64+shim',
    'openblas' or 'custom' (from a path), 'accelerate' (macOS), or 'stock'.
    """

    name: str
    path: str | None = None
    is_optimized: bool = False
    reason: str = ""
    num_threads: int = 0  # 0 when unknown


class _Unavailable(Exception):
    """A candidate library cannot be used; the message says why."""


# What libmlx.so (mlx 0.32) imports: `nm -D --undefined-only`. Anything not listed stays stock.
_CBLAS = ("cblas_sgemm", "cblas_dgemm", "cblas_cgemm")
# LAPACK routine -> (pointer args, hidden Fortran string lengths); forwarded untouched.
_LAPACK = {
    "sgeqrf_": (8, 0), "dgeqrf_": (8, 0), "sorgqr_": (9, 0), "dorgqr_": (9, 0),
    "ssyevd_": (11, 2), "dsyevd_": (11, 2), "cheevd_": (13, 2),
    "spotrf_": (5, 1), "dpotrf_": (5, 1), "sgetrf_": (6, 0), "dgetrf_": (6, 0),
    "sgetri_": (7, 0), "dgetri_": (7, 0), "strtri_": (6, 2), "dtrtri_": (6, 2),
    "sgeev_": (14, 2), "dgeev_": (14, 2), "cgeev_": (14, 2),
    "sgesdd_": (14, 1), "dgesdd_": (14, 1), "cgesdd_": (15, 1),
}  # fmt: skip
_HINT = "pip install scipy-openblas32, or apt install libopenblas0-pthread"
_active: BlasInfo | None = None


def activate(mode: str | None = None) -> BlasInfo:
    """Load an optimized BLAS into the global symbol scope so mlx binds to it; idempotent.

    mode (else env FORKV_BLAS, else 'auto'): 'auto', 'off', or a path to a shared library
    exporting ``cblas_sgemm`` (or the ``scipy_``-prefixed names of a scipy-openblas wheel).
    """
    global _active
    from forkv.security import prepare_process

    prepare_process()  # FORKV_PASSPHRASE out of the env (cc inherits it); private mlx kernel cache
    if _active is not None:
        return _active
    mode = (mode or os.environ.get("FORKV_BLAS") or "auto").strip()
    blas_threads.prepare_env()  # read once, when OpenBLAS loads
    if "mlx.core" in sys.modules:
        warnings.warn(
            "forkv.engine.models.blas.activate() ran after mlx was imported, so mlx keeps the "
            "BLAS it already bound; call it before anything imports mlx.",
            RuntimeWarning,
            stacklevel=2,
        )
        found = status()
        late = BlasInfo("stock", reason="mlx was imported before blas.activate()")
        _active = found if found.is_optimized else late
        return _active
    if sys.platform == "darwin":
        _active = BlasInfo("accelerate", None, True, "mlx on macOS links Accelerate")
    elif sys.platform != "linux":
        _active = BlasInfo("stock", reason=f"no BLAS interposition on {sys.platform}")
    elif mode.lower() == "off":
        _active = BlasInfo("stock", reason="disabled (FORKV_BLAS=off)")
    elif mode.lower() == "auto":
        _active = _activate_auto()
    else:
        try:
            _active = _load_any(mode)
        except _Unavailable as exc:
            _active = BlasInfo("stock", reason=f"FORKV_BLAS={mode}: {exc}")
    return _active


def status() -> BlasInfo:
    """What is active now: the result of `activate`, else what the global symbol scope holds."""
    if _active is not None:
        return _active
    path = _provider_of("cblas_sgemm")
    if path is None:
        return BlasInfo("stock", reason="reference BLAS bundled with mlx (activate() not called)")
    base = os.path.basename(path)
    name = "mkl" if "mkl" in base else "openblas" if "openblas" in base else "custom"
    return BlasInfo(name, path, True, "preloaded outside forkv (e.g. LD_PRELOAD)")


def kernel_label() -> str:
    """What of the CPU BLAS path changes results, for the model fingerprint: the shim's
    one-thread threshold (OpenBLAS's result for a shape can depend on its thread count);
    empty where forkv does not set thread counts."""
    if not status().name.endswith("+shim") or blas_threads.active_split_mnk is None:
        return ""
    return f"openblas-one-thread-below-{blas_threads.active_split_mnk}"


def measure_gflops(dtype: str = "float32", n: int = 1024, reps: int = 5) -> float:
    """Median GFLOP/s of an n x n @ n x n matmul on the CPU stream, after one warm-up."""
    import time

    import mlx.core as mx

    a = mx.random.normal((n, n), dtype=getattr(mx, dtype), stream=mx.cpu)
    b = mx.random.normal((n, n), dtype=getattr(mx, dtype), stream=mx.cpu)
    mx.eval(a, b)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return 2 * n**3 / times[len(times) // 2] / 1e9


def _activate_auto() -> BlasInfo:
    tried = []
    for spec in _candidates():
        try:
            return _load_any(spec)
        except _Unavailable as exc:
            tried.append(f"{os.path.basename(spec)}: {exc}")
    if not tried:
        return BlasInfo("stock", reason=f"no optimized BLAS found ({_HINT})")
    return BlasInfo(
        "stock", reason="; ".join(tried) + " (apt install libopenblas0-pthread needs no cc)"
    )


def _candidates() -> Iterator[str]:
    """Libraries `auto` tries, best first; the prefixed wheels need the shim, so they go last."""
    # pip's `mkl` installs into <prefix>/lib, which is not on the loader's search path.
    mkl = os.path.join(sys.prefix, "lib", "libmkl_rt.so.2")
    for soname in ("libopenblas.so.0", mkl, "libmkl_rt.so.2"):
        try:
            ctypes.CDLL(soname, mode=os.RTLD_LOCAL)
            yield soname
        except OSError:
            pass
    yield from filter(None, (_find_scipy_openblas32(), _find_numpy_openblas()))


def _find_scipy_openblas32() -> str | None:
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or spec.origin is None:
        return None
    return next(map(str, Path(spec.origin).parent.glob("lib/libscipy_openblas*.so")), None)


def _find_numpy_openblas() -> str | None:
    # numpy's Linux wheels vendor scipy-openblas64 (ILP64) under site-packages/numpy.libs.
    spec = importlib.util.find_spec("numpy")
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).parent.parent / "numpy.libs"
    return next(map(str, libs.glob("libscipy_openblas64_*.so")), None)


def _load_any(spec: str | os.PathLike) -> BlasInfo:
    """Load `spec` directly if it exports cblas names, or through the shim if they are prefixed."""
    spec = str(spec)
    try:
        # RTLD_LOCAL first: a library we end up rejecting must not leak symbols into mlx.
        lib = ctypes.CDLL(spec, mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise _Unavailable(f"cannot load it ({exc})") from None
    if hasattr(lib, "cblas_sgemm"):
        ctypes.CDLL(spec, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)  # promote what we just loaded
        path = _provider_of("cblas_sgemm", lib) or spec
        if hasattr(lib, "MKL_Get_Max_Threads"):
            return BlasInfo("mkl", path, True, "MKL", lib.MKL_Get_Max_Threads())
        if not hasattr(lib, "openblas_get_config"):
            return BlasInfo("custom", path, True, "exports cblas_sgemm")
        name = "openblas" if os.sep in spec else "openblas-system"
        return BlasInfo(name, path, True, _openblas_config(lib, "", ""), _threads(lib, "", ""))
    for suffix, bits in (("", 32), ("64_", 64)):
        if hasattr(lib, f"scipy_cblas_sgemm{suffix}"):
            _load_shim(spec, "scipy_", suffix, ilp64=bits == 64)
            reason = _openblas_config(lib, "scipy_", suffix)
            reason += "" if bits == 32 else "; LAPACK stays stock (ILP64)"
            threads = _threads(lib, "scipy_", suffix)
            return BlasInfo(f"scipy-openblas{bits}+shim", spec, True, reason, threads)
    raise _Unavailable(f"{spec} exports neither cblas_sgemm nor scipy_cblas_sgemm")


def _load_shim(lib_path: str, prefix: str, suffix: str, ilp64: bool) -> None:
    shim_path = _build_shim(ilp64)
    shim = ctypes.CDLL(str(shim_path), mode=os.RTLD_LOCAL)
    rc = shim.forkv_shim_init(lib_path.encode(), prefix.encode(), suffix.encode())
    if rc != 0:
        raise _Unavailable(f"shim could not bind symbol #{rc} of {lib_path}")
    # Promote to global only once every forwarder has a target: a NULL one would crash mlx.
    ctypes.CDLL(str(shim_path), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)


def _build_shim(ilp64: bool) -> Path:
    """Compile the forwarding shim once; the file name hashes the source, so edits rebuild it."""
    source = _shim_source(ilp64)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise _Unavailable("no C compiler (cc) to build the scipy-openblas shim; install gcc")
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    cache = Path(os.environ.get("FORKV_CACHE_DIR") or Path(xdg) / "forkv") / "blas"
    out = cache / f"shim-{hashlib.sha256(source.encode()).hexdigest()[:16]}.so"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise _Unavailable(f"cannot make the BLAS shim folder {cache}: {exc}") from None
    # We dlopen what is here: another user who owns, or can write, the folder or the file could
    # make this process run their code. Refuse rather than load it.
    for path in (cache, out):
        if path.exists() and not _is_private(path):
            raise _Unavailable(
                f"{path} is not private to you (another owner, or writable by others); remove "
                "it, or set FORKV_CACHE_DIR to a folder only you can write")
    if out.exists():
        return out
    try:
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            (Path(tmp) / "shim.c").write_text(source)
            cmd = [cc, "-O2", "-shared", "-fPIC", "-o", "shim.so", "shim.c", "-ldl", "-lpthread"]
            run = subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=120, check=False)
            if run.returncode != 0:
                err = run.stderr.decode(errors="replace")[-300:]
                raise _Unavailable(f"{cc} failed to build the BLAS shim: {err}")
            os.replace(Path(tmp) / "shim.so", out)  # atomic: concurrent builders are harmless
    except (OSError, subprocess.SubprocessError) as exc:
        raise _Unavailable(f"cannot build the BLAS shim in {cache}: {exc}") from None
    return out


def _is_private(path: Path) -> bool:
    info = path.lstat()
    return (info.st_uid == os.geteuid() and not info.st_mode & 0o022
            and not stat.S_ISLNK(info.st_mode))


def _shim_source(ilp64: bool) -> str:
    """C that resolves prefixed symbols with dlopen(RTLD_LOCAL) and re-exports them unprefixed.

    The target library stays local so its other unprefixed internals cannot shadow mlx's LAPACK.
    ILP64 takes 64-bit integers, so cblas arguments are widened and LAPACK is left stock.
    """
    names = _CBLAS + (() if ilp64 else tuple(_LAPACK))
    idx = "long long" if ilp64 else "int"
    src = [
        "#include <dlfcn.h>\n#include <stddef.h>\n#include <stdio.h>\n#include <string.h>",
        blas_threads.c_source("scipy_", "64_" if ilp64 else ""),  # threads per call
        f"static void *fp[{len(names)}];",
        "static const char *names[] = {" + ", ".join(f'"{n}"' for n in names) + "};",
        "int forkv_shim_init(const char *path, const char *prefix, const char *suffix) {",
        "  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL); char buf[128];",
        "  if (!lib) return -1;",
        f"  for (int i = 0; i < {len(names)}; i++) {{",
        '    snprintf(buf, sizeof buf, "%s%s%s", prefix, names[i], suffix);',
        "    if (!(fp[i] = dlsym(lib, buf))) return i + 1;",
        "  }\n  forkv_threads_init(lib);\n  return 0;\n}",
    ]
    for i, scalar in enumerate(("float", "double", "const void *")):
        params = "int o, int ta, int tb, {I} m, {I} n, {I} k, {S} al, const void *a, {I} lda, "
        params += "const void *b, {I} ldb, {S} be, void *c, {I} ldc"
        ours, theirs = params.format(I="int", S=scalar), params.format(I=idx, S=scalar)
        args = "o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc"
        call = f"((void (*)({theirs}))fp[{i}])({args});"
        src.append(f"void {_CBLAS[i]}({ours}) {{ int one = forkv_one_thread(m, n, k);\n"
                   f"  forkv_lock();\n  if (one) forkv_set_threads(1);\n  {call}\n"
                   "  if (one) forkv_set_threads(0);\n  forkv_unlock();\n}")
    for i, name in enumerate(names[len(_CBLAS) :], start=len(_CBLAS)):
        num_ptrs, num_lens = _LAPACK[name]
        types = ["void *"] * num_ptrs + ["size_t"] * num_lens
        args = [f"a{j}" for j in range(len(types))]
        params = ", ".join(f"{t} {a}" for t, a in zip(types, args))
        cast = f"(void (*)({', '.join(types)}))fp[{i}]"
        src.append(f"void {name}({params}) {{ ({cast})({', '.join(args)}); }}")
    return "\n".join(src) + "\n"


def _openblas_config(lib: ctypes.CDLL, prefix: str, suffix: str) -> str:
    fn = getattr(lib, f"{prefix}openblas_get_config{suffix}", None)
    if fn is None:
        return "OpenBLAS"
    fn.restype = ctypes.c_char_p
    return fn().decode(errors="replace").strip()


def _threads(lib: ctypes.CDLL, prefix: str, suffix: str) -> int:
    fn = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
    return int(fn()) if fn is not None else 0


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _provider_of(symbol: str, lib: ctypes.CDLL | None = None) -> str | None:
    """File that defines `symbol` in `lib`, or in the global scope (what mlx would bind to)."""
    try:
        addr = ctypes.cast(getattr(lib or ctypes.CDLL(None), symbol), ctypes.c_void_p).value
    except AttributeError:
        return None
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
        return None
    return os.path.realpath(info.dli_fname.decode()) if info.dli_fname else None


def _main(modes: list[str]) -> None:
    """Benchmark matmul GFLOP/s per mode (default: off, auto), one subprocess per mode."""
    code = (
        "import json, sys; from forkv.engine.models import blas; i = blas.activate(sys.argv[1]); "
        "r = {f'{d} n={n}': round(blas.measure_gflops(d, n), 1) "
        "for d in ('float32', 'bfloat16') for n in (1024, 2048)}; "
        "print(json.dumps({'blas': i.name, 'threads': i.num_threads, **r, 'reason': i.reason}))"
    )
    for mode in modes or ["off", "auto"]:
        cmd = [sys.executable, "-c", code, mode]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        print(run.stdout.strip() or run.stderr[-500:])
        sys.stdout.flush()


if __name__ == "__main__":
    _main(sys.argv[1:])
