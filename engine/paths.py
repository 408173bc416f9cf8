"""Where forkv keeps what it builds, and how a built folder gets there whole.

Knows the cache root (`FORKV_CACHE_DIR`, else `$XDG_CACHE_HOME/forkv` or `~/.cache/forkv`),
private cache folders in it, and writing a folder beside its destination and renaming it into
place. Knows nothing of what the folders hold (demo models, conversions, bench variants).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ModelLoadError

__all__ = ["cache_root", "private_cache_folder", "staged_folder"]


def cache_root() -> Path:
    """forkv's cache folder (not created here)."""
    root = os.environ.get("FORKV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forkv")
    return Path(root)


def private_cache_folder(name: str) -> Path:
    """`<forkv cache>/<name>`, created 0700; refused if it is a link or open to others."""
    folder = cache_root() / name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    is_link = stat.S_ISLNK(info.st_mode)  # never chmod through a link: its target is not ours
    if not is_link and info.st_uid == os.geteuid() and info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # made by an older forkv or a loose umask: ours, so tighten
        info = os.lstat(folder)
    if is_link or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ModelLoadError(f"{str(folder)!r} is not a private folder of this user; remove it "
                             "or set FORKV_CACHE_DIR to another place.")
    return folder


@contextmanager
def staged_folder(folder: Path, *, mode: int | None = 0o700,
                  done: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a path (not yet created) beside `folder` for the body to write a folder at; on a
    clean exit give it `mode` and rename it to `folder`, so a crash never leaves half a folder.

    The path lies in a fresh 0700 folder, so no other user can reach into it while it is
    written; that folder is removed however the body ends. An empty `folder` is replaced.
    `done(folder)` says whether a concurrent writer that renamed first left a finished folder
    (then its folder stands and ours is dropped); without `done` losing that race raises.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        out = stage / "out"
        yield out
        if mode is not None:
            os.chmod(out, mode)
        try:
            os.rename(out, folder)  # POSIX: atomic, and replaces an empty folder
        except OSError:
            if done is None or not done(folder):
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
