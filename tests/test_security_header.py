"""The persistent header: bounded before any work, authenticated, bound to one model; the
replaced index is zeroed so an old header cannot bring an old index back (issue 15, 1-3)."""

import dataclasses
import os

import pytest
from forkv.security import (
    BlobStore,
    CorruptStoreError,
    ModelMismatchError,
    StoreSettings,
    WrongKeyError,
    keys,
)
from forkv.security.header import HEADER_BYTES, StoreHeader

PASSPHRASE = "correct horse battery staple"


def settings_for(path, **kw) -> StoreSettings:
    if not {"key_file", "key", "passphrase"} & set(kw):
        kw["passphrase"] = PASSPHRASE
    return StoreSettings.from_env(
        {}, persist_path=str(path), scrypt_n=1 << 15, handle_signals=False, **kw
    )


def make_store(path, n=3, **kw) -> None:
    with BlobStore(settings_for(path, **kw)) as store:
        for i in range(n):
            assert store.put(b"k%d" % i, "state", os.urandom(200))


def read_header(path) -> StoreHeader:
    raw = path.read_bytes()
    return StoreHeader.unpack(raw[:HEADER_BYTES], str(path), len(raw))


def write_header(path, header: StoreHeader) -> None:
    raw = bytearray(path.read_bytes())
    raw[:HEADER_BYTES] = header.pack()
    path.write_bytes(raw)


@pytest.mark.parametrize(
    "costs",
    [
        {"n": 1 << 22, "r": 32, "p": 16},  # 16 GiB of scrypt memory
        {"n": 1 << 21},  # 2 GiB
        {"n": 1 << 20, "p": 16},  # 1 GiB, 16 times over
        {"n": 0},  # a bare ValueError from scrypt before
        {"n": 3},
        {"n": 1 << 10},  # below the minimum: a cheap guess per passphrase
        {"r": 0},
    ],
    ids=str,
)
def test_hostile_scrypt_costs_are_refused_before_any_derivation(tmp_path, monkeypatch, costs):
    path = tmp_path / "s.fkv"
    make_store(path)
    write_header(path, dataclasses.replace(read_header(path), **costs))
    derived = []

    def scrypt(**kw):  # stands in for cryptography's Scrypt: costs are noted, never paid
        derived.append(kw)
        raise AssertionError("scrypt ran")

    monkeypatch.setattr(keys, "Scrypt", scrypt)
    with pytest.raises(CorruptStoreError, match="scrypt costs"):
        BlobStore(settings_for(path))
    assert derived == []  # no key was derived


def test_index_pointer_is_bounded_by_the_file(tmp_path):
    path = tmp_path / "s.fkv"
    make_store(path)
    good = read_header(path)
    for change in [
        {"index_length": 60 << 30},  # sparse 60 GiB: MemoryError before
        {"index_offset": 10},  # inside the header
        {"index_offset": good.index_offset + 1},  # off the grain
        {"index_length": 0},  # non-zero offset, no length
    ]:
        write_header(path, dataclasses.replace(good, **change))
        with pytest.raises(CorruptStoreError):
            BlobStore(settings_for(path))


def test_header_is_authenticated(tmp_path):
    """index_length 0 used to open the store empty without a word (and later writes
    overwrote old records); every field is now under the store key's MAC."""
    path = tmp_path / "s.fkv"
    make_store(path)
    good = read_header(path)
    for change in [{"index_length": 0, "index_offset": 0}, {"model": b"\1" * 32}]:
        write_header(path, dataclasses.replace(good, **change))
        with pytest.raises(CorruptStoreError, match="header .* failed authentication"):
            BlobStore(settings_for(path))
    write_header(path, good)
    with BlobStore(settings_for(path)) as store:
        assert store.stats().num_records == 3


def test_rolled_back_header_is_refused_and_old_index_is_zeroed(tmp_path):
    path = tmp_path / "s.fkv"
    key = os.urandom(32)
    make_store(path, key=key)
    old_raw = path.read_bytes()
    old = read_header(path)
    with BlobStore(settings_for(path, key=key)) as store:
        store.delete(b"k0", "state")
        assert store.put(b"k9", "state", b"new record")
    new = read_header(path)
    assert new.index_offset != old.index_offset
    raw = path.read_bytes()
    if old.index_offset < len(raw):  # not truncated away: its bytes must be gone
        zone = raw[old.index_offset : old.index_offset + old.index_length]
        assert zone != old_raw[old.index_offset : old.index_offset + old.index_length]
        assert zone.count(0) > len(zone) * 0.9  # zeros, or a record sealed over them
    write_header(path, old)  # a 4 KiB edit: the header of the earlier flush
    with pytest.raises(CorruptStoreError, match="index"):
        BlobStore(settings_for(path, key=key))


def test_old_index_extent_is_zeroed(tmp_path):
    path = tmp_path / "s.fkv"
    key = os.urandom(32)
    with BlobStore(settings_for(path, key=key)) as store:
        for i in range(4):
            store.put(b"k%d" % i, "state", b"x" * 1000)
        store.flush()
        first = store._file.header
        sealed = path.read_bytes()[first.index_offset : first.index_offset + first.index_length]
        assert sealed.count(0) < len(sealed) // 2
        store.put(b"k9", "state", b"y" * 5000)  # the next index lands after it: no truncation
        store.flush()
        assert store._file.header.index_offset > first.index_offset
        raw = path.read_bytes()
    assert raw[first.index_offset : first.index_offset + first.index_length] == bytes(
        first.index_length
    )


def test_wrong_key_still_refused_before_mac(tmp_path):
    path = tmp_path / "s.fkv"
    make_store(path)
    with pytest.raises(WrongKeyError):
        BlobStore(settings_for(path, passphrase="wrong"))


def test_store_is_bound_to_one_model(tmp_path):
    path = tmp_path / "s.fkv"
    model_a, model_b = b"A" * 32, b"B" * 32
    with BlobStore(settings_for(path)) as store:
        store.bind_model(model_a)
        store.put(b"k", "state", b"data")
    assert read_header(path).model == model_a
    with BlobStore(settings_for(path)) as store:
        store.bind_model(model_a)  # same model: fine, nothing written
        assert store.get(b"k", "state").data == b"data"
    store = BlobStore(settings_for(path))
    with pytest.raises(ModelMismatchError) as info:
        store.bind_model(model_b)
    message = str(info.value)
    assert model_a.hex()[:16] in message and model_b.hex()[:16] in message
    assert "FORKV_PERSIST_PATH" in message
    assert store.stats().is_enabled is False  # closed: the lock is free again
    with BlobStore(settings_for(path)) as again:
        assert again.get(b"k", "state").data == b"data"


def test_version_1_store_is_a_clear_error(tmp_path):
    path = tmp_path / "s.fkv"
    make_store(path)
    raw = bytearray(path.read_bytes())
    raw[8:10] = (1).to_bytes(2, "big")
    path.write_bytes(raw)
    with pytest.raises(CorruptStoreError, match="format 1"):
        BlobStore(settings_for(path))
