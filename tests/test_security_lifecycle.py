"""Process lifecycle: exit, exception, SIGTERM, SIGKILL mid-write, fork, start-up sweep."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from forkv.security import BlobStore, StoreSettings

CHILD = textwrap.dedent(
    """
    import os, sys, errno
    from forkv.security import BlobStore, StoreSettings, FaultyIO
    io = FaultyIO()
    if sys.argv[3] == "fallback":
        io.fail("open", errno.EOPNOTSUPP, at=2, times=1)  # no O_TMPFILE: named, then unlinked
    store = BlobStore(StoreSettings.from_env({}, disk_dir=sys.argv[1], disk_budget="256MB"), io=io)
    print(store.folder, flush=True)
    record = os.urandom(4 << 20)
    mode = sys.argv[2]
    for i in range(8):
        store.put(b"k%d" % i, "global", record)
    store.flush()
    print("written", flush=True)
    if mode in ("exit", "exception"):
        sys.stdin.readline()  # the parent looks at the folder while we are still alive
    if mode == "exception":
        raise RuntimeError("boom")
    if mode in ("sigkill", "sigterm"):
        i = 0
        while True:  # keep the writer busy: the kill lands mid-write
            store.put(b"loop%d" % (i % 16), "window", record)
            i += 1
    """
)


def spawn(tmp_path, mode, variant="tmpfile"):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), mode, variant],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def forkv_files(tmp_path):
    return [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]


@pytest.mark.parametrize("mode", ["exit", "exception", "sigterm"])
def test_clean_up_on_exit_exception_and_sigterm(tmp_path, mode):
    proc = spawn(tmp_path, mode)
    folder = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "written"
    assert os.path.isdir(folder) and os.listdir(folder) == []  # the data file never has a name
    if mode == "sigterm":
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
    proc.communicate("go\n" if mode != "sigterm" else None, timeout=20)  # closes the pipes
    assert proc.returncode == {"exit": 0, "exception": 1, "sigterm": -signal.SIGTERM}[mode]
    assert not os.path.exists(folder) and os.listdir(tmp_path) == []


@pytest.mark.parametrize("variant", ["tmpfile", "fallback"])
def test_sigkill_mid_write_leaves_nothing_readable(tmp_path, variant):
    proc = spawn(tmp_path, "sigkill", variant)
    folder = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "written"
    time.sleep(0.2)
    proc.kill()
    proc.communicate(timeout=20)  # also closes the pipes
    assert proc.returncode == -signal.SIGKILL
    # The kernel freed the nameless file with the process; only the empty folder is left.
    assert forkv_files(tmp_path) == [] and os.path.isdir(folder)
    store = BlobStore(StoreSettings.from_env({}, disk_dir=str(tmp_path), handle_signals=False))
    assert not os.path.exists(folder), "the start-up sweep removes the dead process's folder"
    assert os.listdir(tmp_path) == [os.path.basename(store.folder)]
    store.close()
    assert os.listdir(tmp_path) == []


def test_forked_child_is_inert_and_leaves_parent_alone(tmp_path):
    store = BlobStore(StoreSettings.from_env({}, disk_dir=str(tmp_path), handle_signals=False))
    store.put(b"k", "global", b"parent data")
    store.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        ok = (
            store.get(b"k", "global") is None
            and not store.put(b"c", "global", b"child")
            and not store.stats().is_enabled
        )
        store.close()  # must not remove the parent's folder
        from forkv.security import lifecycle

        lifecycle.close_all()
        os.write(write, b"ok" if ok else b"bad")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 8)
    os.waitpid(pid, 0)
    assert answer == b"ok"
    assert os.path.isdir(store.folder) and store.get(b"k", "global").data == b"parent data"
    assert store.put(b"after", "global", b"fork") and store.flush()
    assert store.get(b"after", "global").data == b"fork"
    store.close()


PERSIST_CHILD = textwrap.dedent(
    """
    import os, sys
    from forkv.security import BlobStore, StoreSettings
    settings = StoreSettings.from_env({}, persist_path=sys.argv[1], passphrase="pw",
                                    scrypt_n=1 << 15)
    store = BlobStore(settings)
    for i in range(4):
        store.put(b"k%d" % i, "state", bytes([i]) * 100_000)
    store.flush()
    print("flushed", flush=True)
    i = 0
    while True:
        store.put(b"loop%d" % (i % 8), "window", bytes([i % 256]) * 100_000)
        i += 1
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_persistent_store_survives_a_signal_mid_write(tmp_path, sig):
    path = tmp_path / "store.fkv"
    proc = subprocess.Popen(
        [sys.executable, "-c", PERSIST_CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "flushed"
    time.sleep(0.2)
    proc.send_signal(sig)
    proc.communicate(timeout=20)  # also closes the pipes
    assert proc.returncode == -sig
    settings = StoreSettings.from_env({}, persist_path=str(path), passphrase="pw", scrypt_n=1 << 15)
    with BlobStore(settings) as store:  # opens cleanly: the index is the last complete one
        for i in range(4):
            assert store.get(b"k%d" % i, "state").data == bytes([i]) * 100_000
        for j in range(8):
            blob = store.get(b"loop%d" % j, "window")
            assert blob is None or len(set(blob.data)) == 1
        assert store.stats().num_tampered == 0
