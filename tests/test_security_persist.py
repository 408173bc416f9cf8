"""Persistent mode: survives restarts, wrong key is a clear error, nothing overwritten."""

import os
import warnings

import pytest
from forkv.security import (
    BlobStore,
    CorruptStoreError,
    ForkvWarning,
    StoreLockedError,
    StoreSettings,
    UnsafePathError,
    WrongKeyError,
    make_key_file,
)
from forkv.security.persist import HEADER_BYTES


@pytest.fixture(autouse=True)
def no_unexpected_warnings():
    """A ForkvWarning that no test expected (with pytest.warns) fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ForkvWarning)
        yield
    assert [str(w.message) for w in caught if issubclass(w.category, ForkvWarning)] == []


def session_key(store: BlobStore) -> bytes:
    """The current session's data key, derived again the way the store does."""
    df = store._file
    info = b"forkv session key v1|" + df.store_id
    return bytes(df.master.derive(df.session_salts[df.current], info))


def settings_for(path, **kw) -> StoreSettings:
    if not {"key_file", "key", "passphrase"} & set(kw):
        kw["passphrase"] = "correct horse battery staple"
    return StoreSettings.from_env(
        {}, persist_path=str(path), scrypt_n=1 << 15, handle_signals=False, **kw
    )


def fill(store: BlobStore, n=5) -> dict[bytes, bytes]:
    records = {b"k%d" % i: os.urandom(100 * i + 1) for i in range(n)}
    for key, data in records.items():
        assert store.put(key, "state", data, {"i": key.decode()})
    return records


def test_survives_restart(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        records = fill(store)
    assert path.stat().st_mode & 0o777 == 0o600
    with BlobStore(settings_for(path)) as store:
        assert store.stats().num_records == 5
        for key, data in records.items():
            assert store.get(key, "state").data == data
            assert store.get(key, "state").meta == {"i": key.decode()}
        store.delete(b"k1", "state")
        assert store.put(b"new", "window", b"fresh")
    with BlobStore(settings_for(path)) as store:
        assert store.get(b"k1", "state") is None and store.get(b"new", "window").data == b"fresh"
        assert store.get(b"k4", "state").data == records[b"k4"]


@pytest.mark.parametrize("source", ["key_file", "key"])
def test_key_sources(tmp_path, source):
    path = tmp_path / "store.fkv"
    if source == "key_file":
        make_key_file(str(tmp_path / "key"))
        kw = {"key_file": str(tmp_path / "key")}
    else:
        kw = {"key": os.urandom(32)}
    with BlobStore(settings_for(path, **kw)) as store:
        records = fill(store)
    with BlobStore(settings_for(path, **kw)) as store:
        assert all(store.get(k, "state").data == v for k, v in records.items())
    with pytest.raises(WrongKeyError):
        BlobStore(settings_for(path, key=os.urandom(32)))
    with pytest.raises(WrongKeyError, match="not a passphrase"):
        BlobStore(settings_for(path, passphrase="x"))


def test_wrong_key_is_clear_and_overwrites_nothing(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        fill(store)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    with pytest.raises(WrongKeyError, match="does not open"):
        BlobStore(settings_for(path, passphrase="wrong"))
    with pytest.raises(WrongKeyError, match="passphrase"):
        BlobStore(settings_for(path, key=os.urandom(32)))
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    with BlobStore(settings_for(path)) as store:
        assert store.stats().num_records == 5


def test_index_is_authenticated(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        fill(store)
        store.flush()
        header = store._file.header
    raw = bytearray(path.read_bytes())
    raw[header.index_offset + 40] ^= 1
    path.write_bytes(raw)
    with pytest.raises(CorruptStoreError, match="tampered"):
        BlobStore(settings_for(path))


def test_header_tampering_is_refused(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        fill(store)
    good = path.read_bytes()
    for pos, error in [(0, CorruptStoreError), (10, CorruptStoreError), (60, WrongKeyError)]:
        raw = bytearray(good)
        raw[pos] ^= 1
        path.write_bytes(raw)
        with pytest.raises((CorruptStoreError, WrongKeyError)):
            BlobStore(settings_for(path))
    path.write_bytes(good[:HEADER_BYTES] + good[HEADER_BYTES : len(good) // 2])  # truncated
    with pytest.raises(CorruptStoreError):
        BlobStore(settings_for(path))


def test_oversized_lengths_in_index_are_refused(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        fill(store)
        store.flush()
        entry = store._index.get((b"k2", "state"))
        entry.length = 1 << 40  # a lying index, sealed with the right key
        store._dirty = True
    with pytest.raises(CorruptStoreError):
        BlobStore(settings_for(path))


def test_tampered_record_is_a_miss(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        records = fill(store)
        store.flush()
        entry = store._index.get((b"k3", "state"))
    raw = bytearray(path.read_bytes())
    raw[entry.offset + 50] ^= 1
    path.write_bytes(raw)
    with BlobStore(settings_for(path)) as store:
        with pytest.warns(ForkvWarning):
            assert store.get(b"k3", "state") is None
        assert store.get(b"k2", "state").data == records[b"k2"]


def test_records_copied_between_stores_under_one_key(tmp_path):
    key = os.urandom(32)
    paths = [tmp_path / "a.fkv", tmp_path / "b.fkv"]
    entries = []
    for path in paths:
        with BlobStore(settings_for(path, key=key)) as store:
            store.put(b"k", "state", b"S" * 64)
            store.flush()
            entries.append(store._index.get((b"k", "state")))
    a, b = bytearray(paths[0].read_bytes()), bytearray(paths[1].read_bytes())
    n = entries[0].extent
    b[entries[1].offset : entries[1].offset + n] = a[entries[0].offset : entries[0].offset + n]
    paths[1].write_bytes(b)
    with BlobStore(settings_for(paths[1], key=key)) as store, warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        assert store.get(b"k", "state") is None


def test_replayed_old_file_region(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        store.put(b"k", "state", b"v1" * 50)
        store.flush()
        e1 = store._index.get((b"k", "state"))
        old = path.read_bytes()[e1.offset : e1.offset + e1.extent]
        store.put(b"k", "state", b"v2" * 50)
        store.flush()
        e2 = store._index.get((b"k", "state"))
    raw = bytearray(path.read_bytes())
    raw[e2.offset : e2.offset + e2.extent] = old
    path.write_bytes(raw)
    with BlobStore(settings_for(path)) as store, warnings.catch_warnings():
        warnings.simplefilter("ignore", ForkvWarning)
        assert store.get(b"k", "state") is None


def test_symlink_loose_mode_and_lock(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"")
    link = tmp_path / "link.fkv"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        BlobStore(settings_for(link))
    loose = tmp_path / "loose.fkv"
    loose.write_bytes(b"")
    loose.chmod(0o644)
    with pytest.raises(UnsafePathError, match="other users"):
        BlobStore(settings_for(loose))
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)), pytest.raises(StoreLockedError):
        BlobStore(settings_for(path))
    notastore = tmp_path / "other.bin"
    notastore.write_bytes(b"hello world" * 500)
    notastore.chmod(0o600)
    with pytest.raises(CorruptStoreError, match="not a forkv store"):
        BlobStore(settings_for(notastore))
    assert notastore.read_bytes() == b"hello world" * 500


def test_key_never_in_file(tmp_path):
    path = tmp_path / "store.fkv"
    key = os.urandom(32)
    with BlobStore(settings_for(path, key=key)) as store:
        fill(store)
        store.flush()
        session = session_key(store)
    raw = path.read_bytes()
    for secret in (key, session):
        assert secret not in raw and secret.hex().encode() not in raw


def test_wipe_and_budget_eviction_persist(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path, disk_budget=3000)) as store:
        fill(store, 8)
        store.flush()
        assert store.stats().num_evictions > 0
        n = store.stats().num_records
    with BlobStore(settings_for(path, disk_budget=3000)) as store:
        assert store.stats().num_records == n
        store.wipe()
    assert path.stat().st_size < HEADER_BYTES + 512
    with BlobStore(settings_for(path)) as store:
        assert store.stats().num_records == 0 and store.put(b"a", "state", b"b")


def test_session_table_does_not_grow_with_reopens(tmp_path):
    path = tmp_path / "store.fkv"
    with BlobStore(settings_for(path)) as store:
        store.put(b"old", "state", b"from session one")
    for i in range(5):
        with BlobStore(settings_for(path)) as store:
            store.put(b"k", "state", b"v%d" % i)  # each reopen seals under a new session key
    with BlobStore(settings_for(path)) as store:
        assert len(store._file.session_salts) <= 3 + 1  # old's, k's, last index's, this one
        assert store.get(b"old", "state").data == b"from session one"
        assert store.get(b"k", "state").data == b"v4"
