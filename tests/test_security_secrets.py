"""Secrets and plaintext stay out of reprs, tracebacks and the environment (issue 15, 6-7)."""

import json
import os
import subprocess
import sys
import textwrap
import traceback

import pytest
from forkv.security import BlobStore, KeyFileError, StoreSettings, StoreSettingsError
from forkv.security.keys import MasterKey
from forkv.security.writer import WriteItem

PLAINTEXT = b"MY-PRIVATE-PROMPT-TEXT-0123456789"


def test_queued_record_repr_holds_no_plaintext(tmp_path):
    item = WriteItem(b"k", "state", PLAINTEXT, b"{}", {})
    assert PLAINTEXT.decode() not in repr(item) and "33 bytes" in repr(item)
    store = BlobStore(StoreSettings.from_env({}, disk_dir=str(tmp_path)))
    with store, store._lock:  # the writer waits: the record stays queued while we look around
        assert store.put(b"k", "state", PLAINTEXT)
        for obj in (store._pending, store._queue._items, store._file, store):
            assert PLAINTEXT.decode() not in repr(obj)


def test_checkpoint_record_repr_holds_no_tokens_or_arrays():
    from forkv.engine.cache.records import Record

    record = Record("state", 3, PLAINTEXT, {"0.k": PLAINTEXT})
    assert PLAINTEXT.decode() not in repr(record) and "block=3" in repr(record)


def test_malformed_key_file_never_shows_in_a_traceback(tmp_path):
    path = tmp_path / "key"
    secret = "hunter2-" * 5  # a password pasted where a key belongs
    path.write_text(secret)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as info:
        MasterKey.from_key_file(str(path))
    forkv_frames = traceback.walk_tb(info.tb.tb_next)  # every frame below this test's
    text = "".join(traceback.StackSummary.extract(forkv_frames, capture_locals=True).format())
    assert "from_key_file" in text and "_read_key_file" in text
    assert "hunter2" not in text


def test_scrypt_minimum_is_raised():
    with pytest.raises(StoreSettingsError, match="32768"):
        StoreSettings.from_env({}, scrypt_n=1024)
    assert StoreSettings.from_env({}, scrypt_n=1 << 15).scrypt_n == 1 << 15


CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from forkv.engine.models import blas
    from forkv.engine.config import EngineConfig
    from forkv.security import StoreSettings
    blas.activate()  # what every forkv command does first; the BLAS shim may run `cc`
    first = StoreSettings.from_env()
    again = EngineConfig.from_env().settings  # reads os.environ itself, after the move
    child = subprocess.run(["env"], capture_output=True, text=True).stdout
    print(json.dumps({
        "in_environ": "FORKV_PASSPHRASE" in os.environ,
        "in_proc": open("/proc/self/environ", "rb").read().count(sys.argv[1].encode()),
        "in_child": sys.argv[1] in child,
        "first": first.passphrase.reveal().decode(),
        "again": again.passphrase.reveal().decode(),
    }))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_passphrase_leaves_the_environment(tmp_path):
    marker = "pass-" + os.urandom(8).hex()
    env = dict(os.environ, FORKV_PASSPHRASE=marker, FORKV_PERSIST_PATH=str(tmp_path / "s.fkv"))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, marker],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {
        "in_environ": False, "in_proc": 0, "in_child": False, "first": marker, "again": marker
    }  # fmt: skip
