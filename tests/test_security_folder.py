"""Private folder, nameless data file, symlink refusal, start-up sweep."""

import os
import stat
import subprocess
import sys

import pytest
from forkv.security import DiskIO, FaultyIO, UnsafePathError
from forkv.security.folder import (
    check_private,
    make_private_folder,
    open_data_file,
    sweep_stale_folders,
)


def test_folder_and_file_modes(tmp_path):
    io = DiskIO()
    folder = make_private_folder(io, str(tmp_path))
    info = os.lstat(folder.path)
    assert stat.S_ISDIR(info.st_mode) and info.st_mode & 0o777 == 0o700
    assert os.path.basename(folder.path).startswith(f"forkv-{os.getpid()}-")
    for use_tmpfile in (True, False):
        fd = open_data_file(io, folder, use_tmpfile=use_tmpfile)
        st_ = os.fstat(fd)
        assert st_.st_mode & 0o777 == 0o600 and st_.st_nlink == 0 and st_.st_uid == os.geteuid()
        assert os.listdir(folder.path) == []  # nothing with a name, either way
        os.close(fd)
    os.close(folder.dir_fd)


def test_planted_symlink_is_refused(tmp_path):
    io = DiskIO()
    folder = make_private_folder(io, str(tmp_path))
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    os.symlink(target, os.path.join(folder.path, "data"))
    with pytest.raises(UnsafePathError, match="planted"):
        open_data_file(io, folder, use_tmpfile=False)
    assert target.read_bytes() == b"precious"


def test_check_private_refuses_loose_modes(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with pytest.raises(UnsafePathError, match="other users"):
        check_private(os.lstat(loose), "x", is_dir=True)
    link = tmp_path / "link"
    link.symlink_to(loose)
    with pytest.raises(UnsafePathError, match="symlink"):
        check_private(os.lstat(link), "x", is_dir=True)


def test_tmpfile_failure_falls_back_to_unlinked_file(tmp_path):
    io = FaultyIO()
    folder = make_private_folder(io, str(tmp_path))
    io.fail("open", 95, at=1, times=1)  # EOPNOTSUPP for the O_TMPFILE attempt
    fd = open_data_file(io, folder)
    assert os.fstat(fd).st_nlink == 0 and os.listdir(folder.path) == []
    os.close(fd)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_dead_owned_folders(tmp_path):
    dead = tmp_path / f"forkv-{_dead_pid()}-abc123"
    dead.mkdir(mode=0o700)
    (dead / "data").write_bytes(b"ciphertext")
    alive = tmp_path / f"forkv-{os.getppid()}-def456"  # our parent is alive
    alive.mkdir(mode=0o700)
    mine = make_private_folder(DiskIO(), str(tmp_path))
    other = tmp_path / "forkv-notapid-x"
    other.mkdir()
    link_target = tmp_path / "keep"
    link_target.mkdir()
    link = tmp_path / f"forkv-{_dead_pid()}-lnk"
    link.symlink_to(link_target)
    removed = sweep_stale_folders(DiskIO(), str(tmp_path))
    assert removed == [str(dead)]
    assert alive.exists() and os.path.exists(mine.path) and other.exists() and link_target.exists()


def test_sweep_skips_folder_still_locked(tmp_path):
    # A dead pid but a live lock (a forked child still holds the folder): keep it.
    folder = make_private_folder(DiskIO(), str(tmp_path))
    renamed = str(tmp_path / f"forkv-{_dead_pid()}-locked")
    os.rename(folder.path, renamed)
    assert sweep_stale_folders(DiskIO(), str(tmp_path)) == []
    os.close(folder.dir_fd)
    assert sweep_stale_folders(DiskIO(), str(tmp_path)) == [renamed]
