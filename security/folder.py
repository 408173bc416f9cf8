"""The private folder and the data file of an ephemeral store, and the start-up sweep.

Knows: how to make a folder only we can enter (``mkdtemp`` 0700, checked with ``lstat`` and
``fstat``), which parent folders are safe (none that other users can write without the sticky
bit), how to open a data file no other user can open and no path names, ever
(``O_TMPFILE|O_EXCL``, else ``O_EXCL|O_NOFOLLOW`` then an immediate unlink), and how to
recognise and remove folders left by dead forkv processes; and how to write a named file
only we can read (``write_private_file``: trees, pages, specs). Does not know: what goes
into the files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
from dataclasses import dataclass

from .errors import UnsafePathError
from .fileio import DiskIO

__all__ = [
    "PrivateFolder",
    "check_parents",
    "check_private",
    "make_private_folder",
    "open_data_file",
    "sweep_stale_folders",
    "write_private_file",
]

log = logging.getLogger("forkv.security")
FOLDER_PREFIX = "forkv-"
_FOLDER_RE = re.compile(r"^forkv-(\d+)-[A-Za-z0-9_]+$")
_DIR_FLAGS = (
    os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
)
_FILE_FLAGS = os.O_RDWR | os.O_CLOEXEC


@dataclass(slots=True)
class PrivateFolder:
    path: str
    dir_fd: int


def check_private(info: os.stat_result, what: str, *, is_dir: bool) -> None:
    """Refuse anything that is a link, not ours, or open to group/other."""
    kind_ok = stat.S_ISDIR(info.st_mode) if is_dir else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        raise UnsafePathError(
            f"{what} is not a real {'directory' if is_dir else 'file'} (symlink?); remove it."
        )
    if info.st_uid != os.geteuid():
        raise UnsafePathError(
            f"{what} is owned by uid {info.st_uid}, not us; remove it or pick another path."
        )
    if info.st_mode & 0o077:
        raise UnsafePathError(
            f"{what} is open to other users (mode {info.st_mode & 0o777:o}); chmod it 600/700."
        )


def check_parents(path: str, what: str) -> None:
    """Refuse ``path`` if a folder above it can be written by other users without the sticky bit.

    Such a user could rename our file away and put theirs in its place. A group-writable
    folder counts unless its group is our own effective group (user-private groups).
    """
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            info = os.stat(folder)
        except OSError:
            return  # not there (yet): opening the path reports it
        mode = info.st_mode
        shared = mode & 0o002 or (mode & 0o020 and info.st_gid != os.getegid())
        if shared and not mode & stat.S_ISVTX:
            raise UnsafePathError(
                f"{what} sits under {folder}, which other users can write (mode {mode & 0o7777:o}) "
                f"without the sticky bit, so they could swap it; run `chmod go-w {folder}` (or "
                f"`chmod +t {folder}`), or move it to a folder only you can write."
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def write_private_file(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (conversation text, say; a str is written as UTF-8) to a file only we can
    read, in a folder other users cannot rewrite: a new file beside it, created 0600 and
    exclusively, is renamed over ``path``, so the data is never in a file others can open —
    not even when ``path`` was 0644, or held open by someone — and a crash leaves the old file
    whole. A symlink, or a file that is not a regular file of ours, at ``path`` is refused.
    The one way forkv writes a file that holds conversation content."""
    path = os.fspath(path)
    check_parents(path, f"File {path}")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(f"{path} is a symlink; write to a real file.")
    if info is not None and (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid()):
        raise UnsafePathError(f"{path} is not a regular file of yours; pick another path.")
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_private_folder(io: DiskIO, parent: str | None = None) -> PrivateFolder:
    """``<parent>/forkv-<pid>-<random>``, mode 0700, opened as a directory fd we hold."""
    parent = parent or tempfile.gettempdir()
    check_parents(os.path.join(parent, FOLDER_PREFIX), f"The disk tier's folder in {parent}")
    path = io.mkdtemp(f"{FOLDER_PREFIX}{os.getpid()}-", parent)
    before = io.lstat(path)
    check_private(before, f"Folder {path}", is_dir=True)
    dir_fd = io.open(path, _DIR_FLAGS)
    after = io.fstat(dir_fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        io.close(dir_fd)
        raise UnsafePathError(f"Folder {path} was replaced while we opened it; not using it.")
    try:
        io.lock(dir_fd)  # held until we exit, even by SIGKILL: tells the sweep we are alive
    except OSError as exc:
        log.debug("cannot lock %s (%s); the sweep relies on the pid", path, exc.strerror)
    return PrivateFolder(path, dir_fd)


def open_data_file(io: DiskIO, folder: PrivateFolder, *, use_tmpfile: bool = True) -> int:
    """A 0600 data file that has no name: ``O_TMPFILE``, else create-exclusive and unlink."""
    fd = -1
    if use_tmpfile and hasattr(os, "O_TMPFILE"):
        try:
            # O_EXCL: linkat() can never give this file a name, not even through /proc/self/fd.
            flags = _FILE_FLAGS | os.O_TMPFILE | os.O_EXCL
            fd = io.open(".", flags, 0o600, dir_fd=folder.dir_fd)
        except OSError as exc:
            log.debug("O_TMPFILE unavailable (%s); using create-and-unlink", exc.strerror)
    if fd < 0:
        flags = _FILE_FLAGS | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = io.open("data", flags, 0o600, dir_fd=folder.dir_fd)
        except FileExistsError:
            raise UnsafePathError(
                f"Something already sits at {folder.path}/data (planted link?); refusing it."
            ) from None
        io.unlink("data", dir_fd=folder.dir_fd)  # as early as possible: only our fd reaches it now
    try:
        info = io.fstat(fd)
        check_private(info, "The data file", is_dir=False)
        if info.st_nlink != 0:
            raise UnsafePathError("The data file still has a name after unlinking; refusing it.")
    except BaseException:
        io.close(fd)
        raise
    return fd


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, belongs to someone else
    return True


def sweep_stale_folders(io: DiskIO, parent: str | None = None) -> list[str]:
    """Remove ``forkv-<pid>-*`` folders we own whose process is dead and whose lock is free."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = io.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = _FOLDER_RE.match(name)
        if not match or int(match.group(1)) == os.getpid() or _is_alive(int(match.group(1))):
            continue
        path = os.path.join(parent, name)
        try:
            info = io.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue  # never follow links or touch other users' folders
            fd = io.open(path, _DIR_FLAGS)
            try:
                io.lock(fd)  # fails if any process (a forked child, say) still holds it
            except BlockingIOError:
                continue
            except OSError:
                pass  # no locks on this file system: the pid check alone decides
            finally:
                io.close(fd)
            io.rmtree(path)
            removed.append(path)
        except OSError:
            continue
    if removed:
        log.info("removed %d stale forkv folder(s) of dead processes", len(removed))
    return removed
