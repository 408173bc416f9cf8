"""Key material: Secret, MasterKey, key files, scrypt, fork hygiene."""

import base64
import copy
import os
import pickle

import pytest
from forkv.security import KeyFileError, Secret, UnsafePathError, make_key_file
from forkv.security.keys import MasterKey


def test_secret_redacted_and_unpicklable():
    s = Secret("hunter2")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    assert s.reveal() == b"hunter2" and len(s) == 7
    with pytest.raises(TypeError):
        pickle.dumps(s)
    assert copy.deepcopy(s) is s
    assert s == Secret(b"hunter2") and s != Secret("other")
    s.wipe()
    assert s.reveal() == bytes(7)


def test_master_key_repr_pickle_wipe():
    m = MasterKey.make_ephemeral()
    raw = bytes(m._buf)
    assert raw.hex() not in repr(m) and str(list(raw)) not in repr(m)
    with pytest.raises(TypeError):
        pickle.dumps(m)
    sub = m.derive(b"s" * 32, b"info")
    assert len(sub) == 32 and bytes(sub) != raw
    assert m.derive(b"s" * 32, b"info") == sub and m.derive(b"t" * 32, b"info") != sub
    m.wipe()
    with pytest.raises(RuntimeError):
        m.derive(b"s" * 32, b"info")


def test_ephemeral_keys_differ():
    assert MasterKey.make_ephemeral()._buf != MasterKey.make_ephemeral()._buf


@pytest.mark.parametrize("encoding", ["raw", "hex", "b64"])
def test_key_file_formats(tmp_path, encoding):
    key = os.urandom(32)
    data = {"raw": key, "hex": key.hex().encode() + b"\n", "b64": base64.b64encode(key)}[encoding]
    path = tmp_path / "k"
    path.write_bytes(data)
    path.chmod(0o600)
    assert bytes(MasterKey.from_key_file(str(path))._buf) == key


def test_key_file_refusals(tmp_path):
    loose = tmp_path / "loose"
    loose.write_bytes(os.urandom(32))
    loose.chmod(0o644)
    with pytest.raises(UnsafePathError, match="chmod 600"):
        MasterKey.from_key_file(str(loose))
    bad = tmp_path / "bad"
    bad.write_bytes(b"not a key")
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="make_key_file"):
        MasterKey.from_key_file(str(bad))
    link = tmp_path / "link"
    good = tmp_path / "good"
    make_key_file(str(good))
    link.symlink_to(good)
    with pytest.raises(UnsafePathError, match="symlink"):
        MasterKey.from_key_file(str(link))
    with pytest.raises(KeyFileError):
        MasterKey.from_key_file(str(tmp_path / "missing"))


def test_make_key_file(tmp_path):
    path = tmp_path / "k"
    make_key_file(str(path))
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(bytes.fromhex(path.read_text().strip())) == 32
    with pytest.raises(FileExistsError):
        make_key_file(str(path))


def test_passphrase_kdf_is_deterministic_per_salt():
    a = MasterKey.from_passphrase(Secret("pw"), b"s" * 16, 1 << 15)
    b = MasterKey.from_passphrase(Secret("pw"), b"s" * 16, 1 << 15)
    c = MasterKey.from_passphrase(Secret("pw"), b"t" * 16, 1 << 15)
    assert a._buf == b._buf != c._buf
    assert a.check_value(b"x") == b.check_value(b"x") != c.check_value(b"x")


def test_forked_child_forgets_keys():
    m = MasterKey.make_ephemeral()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited key must be gone
        os.close(read)
        os.write(write, b"wiped" if len(m._buf) == 0 else b"kept")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.waitpid(pid, 0)
    assert answer == b"wiped"
    assert len(m._buf) == 32  # the parent keeps its key
