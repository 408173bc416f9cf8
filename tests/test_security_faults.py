"""Fault policy: disk full, I/O errors, folder deleted, truncation -> warn, miss, recompute.

Each test runs a toy "generation": a chain of block states where each block's state is a
hash of the previous one, checkpointed to the store and restored from it when present. The
output must equal a fault-free run, whatever the disk does.
"""

import errno
import hashlib
import os
import shutil
import warnings

import pytest
from forkv.security import BlobStore, FaultyIO, ForkvWarning, StoreSettings

NUM_BLOCKS = 24


def make_store(tmp_path, io, **kw) -> BlobStore:
    kw.setdefault("disk_budget", 64 << 20)
    return BlobStore(
        StoreSettings.from_env({}, disk_dir=str(tmp_path), handle_signals=False, **kw), io=io
    )


def block_state(prev: bytes, i: int) -> bytes:
    return hashlib.sha256(prev + i.to_bytes(4, "big")).digest() * 64  # 2 KiB "cache"


def generate(store: BlobStore, between=lambda i: None) -> tuple[bytes, int]:
    """Restore the longest prefix from the store, recompute the rest, checkpoint as we go."""
    state, recomputed = b"seed", 0
    for i in range(NUM_BLOCKS):
        blob = store.get(b"blk%d" % i, "state")
        if blob is not None and blob.meta.get("i") == str(i):
            state = blob.data
        else:
            state = block_state(state, i)
            recomputed += 1
            store.put(b"blk%d" % i, "state", state, {"i": str(i)})
        between(i)
    store.flush()
    return hashlib.sha256(state).digest(), recomputed


@pytest.fixture(scope="module")
def expected():
    state = b"seed"
    for i in range(NUM_BLOCKS):
        state = block_state(state, i)
    return hashlib.sha256(state).digest()


def test_clean_run_restores_everything(tmp_path, expected):
    with make_store(tmp_path, FaultyIO()) as store:
        assert generate(store) == (expected, NUM_BLOCKS)
        assert generate(store) == (expected, 0)


@pytest.mark.parametrize("k", [1, 5, 12])
def test_disk_full_at_kth_write(tmp_path, expected, k):
    io = FaultyIO()
    io.fail("pwrite", errno.ENOSPC, at=k)
    with make_store(tmp_path, io) as store:
        with pytest.warns(ForkvWarning):
            first = generate(store)
        assert first[0] == expected
        out, recomputed = generate(store)
        assert out == expected and recomputed == NUM_BLOCKS - (k - 1)  # blocks before k restore
        s = store.stats()
        assert s.is_degraded and s.is_enabled == (k > 1) and s.num_records == k - 1
        assert s.num_dropped >= NUM_BLOCKS - k + 1


def test_disk_full_is_read_only_until_wipe(tmp_path, expected):
    io = FaultyIO()
    io.fail("pwrite", errno.ENOSPC, at=6, times=1)
    with make_store(tmp_path, io) as store:
        with pytest.warns(ForkvWarning, match="full"):
            first = generate(store)
        assert first[0] == expected
        assert store.stats().is_enabled and store.stats().is_degraded
        assert not store.put(b"x", "state", b"x")
        assert generate(store) == (expected, NUM_BLOCKS - 5)
        store.wipe()  # frees the space: writes resume
        assert generate(store) == (expected, NUM_BLOCKS)
        assert generate(store) == (expected, 0)


@pytest.mark.parametrize("err", [errno.EIO, errno.EBADF, errno.EROFS])
def test_write_error_disables_tier(tmp_path, expected, err):
    io = FaultyIO()
    io.fail("pwrite", err, at=3)
    with make_store(tmp_path, io) as store:
        with pytest.warns(ForkvWarning, match="disk tier off"):
            first = generate(store)
        assert first[0] == expected
        s = store.stats()
        assert not s.is_enabled and s.is_degraded and s.num_failed == 1
        assert generate(store) == (expected, NUM_BLOCKS)  # every get is now a miss
        assert not store.put(b"x", "state", b"x")


def test_read_errors_are_misses_then_disable(tmp_path, expected):
    io = FaultyIO()
    with make_store(tmp_path, io) as store:
        generate(store)
        io.fail("pread_into", errno.EIO)
        with pytest.warns(ForkvWarning):
            assert generate(store)[0] == expected
        assert not store.stats().is_enabled and store.stats().num_failed == 3


def test_short_reads_are_misses(tmp_path, expected):
    io = FaultyIO()
    with make_store(tmp_path, io) as store:
        generate(store)
        io.fail("pread_into", 0, at=1, times=4)
        with pytest.warns(ForkvWarning, match="read fault"):
            out, recomputed = generate(store)
        assert out == expected and recomputed == 4  # each short read is one miss
        assert store.stats().is_enabled


def test_folder_deleted_mid_run(tmp_path, expected):
    with make_store(tmp_path, FaultyIO()) as store:
        folder = store.folder

        def remove_folder(i):
            if i == 5:
                shutil.rmtree(folder)

        with warnings.catch_warnings():
            warnings.simplefilter("error", ForkvWarning)  # the nameless file does not care
            assert generate(store, remove_folder)[0] == expected
            assert generate(store) == (expected, 0)
        assert not os.path.exists(folder)
    assert not os.path.exists(folder)


def test_folder_vanishes_for_io_calls(tmp_path, expected):
    io = FaultyIO()
    io.fail("pwrite", errno.ENOENT, at=4)
    io.fail("rmtree", errno.ENOENT)
    with make_store(tmp_path, io) as store:
        with pytest.warns(ForkvWarning):
            first = generate(store)
        assert first[0] == expected
    assert generate(store) == (expected, NUM_BLOCKS)


def test_file_truncated_under_us(tmp_path, expected):
    with make_store(tmp_path, FaultyIO()) as store:
        generate(store)
        os.ftruncate(store._file.fd, 4096)
        with pytest.warns(ForkvWarning):
            out, recomputed = generate(store)
        assert out == expected and recomputed > 0 and store.stats().num_failed >= 1


def test_file_corrupted_under_us(tmp_path, expected):
    with make_store(tmp_path, FaultyIO()) as store:
        generate(store)
        size = os.fstat(store._file.fd).st_size
        os.pwrite(store._file.fd, os.urandom(size), 0)
        with pytest.warns(ForkvWarning, match="authentication"):
            out, recomputed = generate(store)
        assert out == expected and recomputed == NUM_BLOCKS
        assert store.stats().num_tampered == NUM_BLOCKS


def test_unusable_folder_parent_disables_with_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(ForkvWarning, match="private folder"):
        store = BlobStore(StoreSettings.from_env({}, disk_dir=str(blocker), handle_signals=False))
    assert not store.put(b"k", "state", b"x") and store.get(b"k", "state") is None
    assert store.stats().is_degraded
    store.close()


def test_planted_symlink_disables_with_warning(tmp_path):
    class PlantingIO(FaultyIO):
        def open(self, path, flags, mode=0o600, dir_fd=None):
            if path == "data":  # the fallback's name: plant a link to a victim first
                os.symlink(tmp_path / "victim", "data", dir_fd=dir_fd)
            return super().open(path, flags, mode, dir_fd=dir_fd)

    (tmp_path / "victim").write_bytes(b"precious")
    io = PlantingIO()
    io.fail("open", errno.EOPNOTSUPP, at=2, times=1)  # no O_TMPFILE: use the named fallback
    with pytest.warns(ForkvWarning, match="planted"):
        store = make_store(tmp_path, io)
    assert not store.stats().is_enabled and (tmp_path / "victim").read_bytes() == b"precious"
    store.close()
