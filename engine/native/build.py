"""Build forkv's CPU kernels (src/, C++17) into forkv's cache, once per mlx release.

Why on first use rather than at `pip install`: the extension links against the installed
mlx's C++ library and shares its nanobind type registry, so it must be rebuilt whenever mlx
changes; a build at install time would go stale on `pip install -U mlx` and make an editable
install need a compiler. The cache key hashes the sources, mlx's and nanobind's versions, the
Python ABI and the compiler, so any change builds again (about 20 s on 2 cores) and a stale
build is never loaded. The folder is private (0700) and anything not ours is refused: this
module dlopens what it finds there. Knows nothing about kernels or models.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

__all__ = ["BuildError", "built_library", "cache_key"]

_SRC = Path(__file__).parent / "src"
_MODULE = "_forkv_native"
_TIMEOUT_S = 600


class BuildError(Exception):
    """The kernels cannot be built here; the message says why and what to install."""


def cache_key() -> str:
    h = hashlib.sha256()
    for f in sorted(_SRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    for dist in ("mlx", "nanobind"):
        h.update(f"{dist}={_version(dist)}".encode())
    h.update((sysconfig.get_config_var("EXT_SUFFIX") or "").encode())
    h.update((_compiler() or "").encode())
    return h.hexdigest()[:20]


def built_library(*, build: bool = True) -> Path:
    """The compiled module for this mlx, building it first unless `build` is False."""
    folder = _cache_dir() / cache_key()
    lib = folder / f"{_MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    _check_private(folder.parent)
    if lib.exists():
        _check_private(folder)
        _check_private(lib)
        return lib
    if not build:
        raise BuildError("not built yet")
    cmake = _cmake()
    if _compiler() is None:
        raise BuildError("no C++ compiler (c++, g++ or clang++; or set CXX): install one, e.g. "
                         "apt install g++")
    if _version("nanobind") is None:
        raise BuildError("nanobind is not installed (pip install 'nanobind>=3.0,<3.2')")
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".build-") as tmp:
        env = dict(os.environ, CXX=_compiler())
        configure = [cmake, "-S", str(_SRC), "-B", tmp, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        for cmd in (configure, [cmake, "--build", tmp, "-j", str(os.cpu_count() or 2)]):
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                     timeout=_TIMEOUT_S, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                raise BuildError(f"{Path(cmd[0]).name} failed to run: {e}") from None
            if run.returncode != 0:
                tail = (run.stderr or run.stdout).strip().splitlines()[-6:]
                raise BuildError(f"the build failed ({' '.join(cmd[:2])}): " + " | ".join(tail))
        found = next(Path(tmp).glob(f"{_MODULE}*.so"), None)
        if found is None:
            raise BuildError(f"the build produced no {_MODULE} module in {tmp}")
        stage = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".stage-"))
        os.replace(found, stage / lib.name)
        try:
            os.rename(stage, folder)  # atomic: a concurrent builder's folder is as good
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
    return built_library(build=False)


def _cache_dir() -> Path:
    root = os.environ.get("FORKV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forkv")
    folder = Path(root) / "native"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _check_private(path: Path) -> None:
    info = path.lstat()
    if (stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid()
            or info.st_mode & 0o022):
        raise BuildError(f"{path} is not private to you (a link, another owner, or writable by "
                         "others); remove it, or set FORKV_CACHE_DIR to a folder only you own")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and (found := shutil.which(name)):
            return found
    return None


def _cmake() -> str:
    found = shutil.which("cmake")
    if found is None:
        try:  # the `cmake` wheel, when its scripts folder is not on PATH
            import cmake

            found = os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
        except (ImportError, AttributeError):
            raise BuildError("cmake is not installed (pip install cmake, or apt install "
                             "cmake)") from None
    return found
