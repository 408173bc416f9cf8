"""Process-wide protections: no core dumps, no secrets in the environment, a private mlx cache.

Knows: how to stop this process from dumping core or being read by same-user debuggers
(``harden_process``: RLIMIT_CORE 0, ``prctl(PR_SET_DUMPABLE, 0)``), how to take
``FORKV_PASSPHRASE`` out of the environment, and how to give mlx's CPU kernel cache a private
folder (``use_private_tmpdir``). Does not know mlx: it only sets ``TMPDIR``, which mlx reads
each time it compiles a CPU kernel.

Why the mlx cache: mlx (0.32, ``backend/cpu/compiled.cpp``) writes generated C++ to
``$TMPDIR/mlx/<version>/cpu`` (``/tmp`` by default), creates that folder with default modes
if it is missing, and ``dlopen``s ``lib<kernel>.so`` from it if the file already exists,
without checking who owns it. Another local user who creates that folder first (or can
write into it) can plant a shared object that our process then loads and runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import stat
import sys
import tempfile
import warnings
from dataclasses import dataclass

from .errors import ForkvWarning, UnsafePathError
from .folder import check_parents
from .memory import is_dontdump_available

__all__ = ["HardenReport", "harden_process", "prepare_process", "use_private_tmpdir"]

_PR_SET_DUMPABLE = 4


@dataclass(slots=True, frozen=True)
class HardenReport:
    """What ``harden_process`` managed to switch on (False: the platform refused or lacks it)."""

    no_core_dumps: bool  # RLIMIT_CORE is 0 (soft and hard)
    not_dumpable: bool  # prctl(PR_SET_DUMPABLE, 0): no core, no ptrace or /proc/<pid>/mem by peers
    keys_dontdump: bool  # key buffers live on MADV_DONTDUMP pages


def harden_process() -> HardenReport:
    """Opt-in: keep this process's memory (keys, plaintext checkpoints) out of core dumps and
    away from same-user debuggers. Irreversible for the process; call it early."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        no_core = True
    except (ValueError, OSError):
        no_core = False
    not_dumpable = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            not_dumpable = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    return HardenReport(no_core, not_dumpable, is_dontdump_available())


def prepare_process() -> None:
    """What every forkv process does before mlx runs: take the passphrase out of the
    environment (children such as the BLAS shim's ``cc`` must not inherit it) and give mlx a
    private kernel cache. Idempotent; never raises."""
    from .settings import take_passphrase_from_env

    take_passphrase_from_env()
    use_private_tmpdir()


def _cache_root() -> str:
    return os.environ.get("FORKV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "forkv"
    )


def _is_private_dir(path: str) -> bool:
    try:
        info = os.lstat(path)
        check_parents(os.path.join(path, "x"), path)
    except (OSError, UnsafePathError):
        return False
    owned = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
    return owned and not info.st_mode & 0o022


def use_private_tmpdir() -> str | None:
    """Point ``TMPDIR`` of this process at ``<forkv cache>/tmp`` (0700) unless the current
    temp folder is already ours alone; returns the folder now in use, None if left alone.

    Python's own ``tempfile`` keeps the folder it had (pinned first), so only native code
    reading ``TMPDIR`` (mlx's CPU compiler) and child processes see the private one.
    """
    current = os.environ.get("TMPDIR") or "/tmp"
    if _is_private_dir(current):
        return None
    folder = os.path.join(_cache_root(), "tmp")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        info = os.lstat(folder)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.chmod(folder, 0o700)  # ours but loose (made by an older forkv or by hand)
    except OSError:
        pass
    if not _is_private_dir(folder):
        message = (
            f"forkv: cannot make a private folder at {folder} for mlx's kernel cache, so mlx "
            f"keeps using {current}, which other users can write to; set FORKV_CACHE_DIR to a "
            "folder only you can write."
        )
        try:
            warnings.warn(message, ForkvWarning, stacklevel=2)
        except Warning:  # -W error must not stop a process over a warning
            logging.getLogger("forkv.security").warning("%s", message)
        return None
    tempfile.gettempdir()  # pin Python's choice before TMPDIR changes under it
    os.environ["TMPDIR"] = folder
    return folder
