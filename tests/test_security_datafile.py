"""DataFile: sealed record I/O on the nameless file, session keys, closing."""

import os

import pytest
from forkv.security import DiskIO
from forkv.security.aead import RecordAuthError, make_aad, sealed_size
from forkv.security.datafile import TruncatedRecordError, open_ephemeral
from forkv.security.index import Entry


def write(df, offset, data, gen=1):
    aad = make_aad(df.store_id, b"k", "global", gen, len(data), b"{}")
    nonce, n = df.write_record(offset, data, aad, df.current)
    return Entry(offset, n, len(data), nonce, gen, df.current), aad


def test_write_read_and_sessions(tmp_path):
    df = open_ephemeral(DiskIO(), str(tmp_path))
    data = os.urandom(10000)
    entry, aad = write(df, df.alloc.allocate(sealed_size(len(data))), data)
    assert df.read_record(entry, aad) == data
    assert data not in os.pread(df.fd, 20000, 0)
    df.reset_sessions()  # wipe: the old session key is gone for good
    with pytest.raises(RecordAuthError):
        df.read_record(entry, aad)
    entry2, aad2 = write(df, 0, b"again", gen=2)
    assert df.read_record(entry2, aad2) == b"again"
    folder = df.folder.path
    df.close(remove_folder=True)
    assert not os.path.exists(folder) and len(df.master._buf) == 0


def test_short_file_is_a_truncated_record(tmp_path):
    df = open_ephemeral(DiskIO(), str(tmp_path))
    entry, aad = write(df, 0, os.urandom(5000))
    df.truncate(100)
    with pytest.raises(TruncatedRecordError):
        df.read_record(entry, aad)
    df.close(remove_folder=True)


def test_scratch_buffers_are_reused(tmp_path):
    df = open_ephemeral(DiskIO(), str(tmp_path))
    entry, aad = write(df, 0, os.urandom(5000))
    first = df._scratch
    write(df, 8192, os.urandom(4000))
    assert df._scratch is first  # no new allocation for a smaller record
    df.read_record(entry, aad)
    buf = df._read_scratch._local.buf
    df.read_record(entry, aad)
    assert df._read_scratch._local.buf is buf
    df.close(remove_folder=True)


def test_read_record_into_writes_only_verified_plaintext(tmp_path):
    df = open_ephemeral(DiskIO(), str(tmp_path))
    data = os.urandom(5000)
    entry, aad = write(df, 0, data)
    out = bytearray(5000)
    df.read_record_into(entry, aad, memoryview(out))
    assert out == data
    out[:] = b"\xff" * 5000
    with pytest.raises(RecordAuthError):
        df.read_record_into(entry, aad + b"x", memoryview(out))
    assert out == bytes(5000)
    df.truncate(100)
    with pytest.raises(TruncatedRecordError):
        df.read_record_into(entry, aad, memoryview(out))
    df.close(remove_folder=True)
