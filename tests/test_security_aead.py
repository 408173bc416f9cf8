"""Sealer: record layout, nonce uniqueness and format, AAD binding, wipe on failure."""

import os

import pytest
from forkv.security import NonceError, Sealer
from forkv.security.aead import HEADER_SIZE, RecordAuthError, make_aad, sealed_size
from hypothesis import given, settings
from hypothesis import strategies as st

AAD = make_aad(b"S" * 16, b"key", "global", 7, 5, b"{}")


def test_roundtrip_and_self_describing_header():
    s = Sealer(os.urandom(32))
    nonce, record = s.seal(b"hello", AAD)
    assert len(nonce) == 12 and len(record) == sealed_size(5)
    assert record[:4] == b"FKVR" and record[4] == 1 and b"aes-256-gcm" in record[:HEADER_SIZE]
    assert record[HEADER_SIZE - 12 : HEADER_SIZE] == nonce
    assert b"hello" not in record
    assert s.open(record, AAD, nonce) == b"hello"


def test_nonces_unique_across_100k_records():
    s = Sealer(os.urandom(32))
    out = memoryview(bytearray(sealed_size(1)))
    nonces = {s.seal_into(b"x", AAD, out) for _ in range(100_000)}
    assert len(nonces) == 100_000 and s.num_sealed == 100_000


def test_nonce_cap_enforced():
    s = Sealer(os.urandom(32), nonce_limit=3)
    for _ in range(3):
        s.seal(b"x", AAD)
    with pytest.raises(NonceError):
        s.seal(b"x", AAD)


@pytest.mark.parametrize("length", [0, 8, 11, 13, 16])
def test_non_12_byte_nonces_rejected(length):
    s = Sealer(os.urandom(32))
    nonce, record = s.seal(b"x", AAD)
    with pytest.raises(NonceError):
        s.open(record, AAD, nonce[:length] if length <= 12 else nonce + bytes(length - 12))
    with pytest.raises(NonceError):
        s.open_into(record, AAD, bytes(length), memoryview(bytearray(1)))


@pytest.mark.parametrize("field", ["store_id", "key", "kind", "generation", "length", "meta"])
def test_aad_binds_every_field(field):
    args = {"store_id": b"S" * 16, "key": b"key", "kind": "global", "generation": 7}
    args |= {"length": 5, "meta": b"{}"}
    s = Sealer(os.urandom(32))
    nonce, record = s.seal(b"hello", make_aad(**args))
    changed = dict(args)
    changed[field] = {"store_id": b"T" * 16, "key": b"kez", "kind": "window", "generation": 6,
                      "length": 6, "meta": b'{"a":"b"}'}[field]  # fmt: skip
    with pytest.raises(RecordAuthError):
        s.open(record, make_aad(**changed), nonce)


def test_wrong_key_and_wrong_nonce():
    a, b = Sealer(os.urandom(32)), Sealer(os.urandom(32))
    nonce, record = a.seal(b"hello", AAD)
    with pytest.raises(RecordAuthError):
        b.open(record, AAD, nonce)
    with pytest.raises(RecordAuthError, match="nonce"):
        a.open(record, AAD, (int.from_bytes(nonce, "big") + 1).to_bytes(12, "big"))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), pos=st.integers(min_value=0), bit=st.integers(0, 7))
def test_any_bit_flip_is_refused(data, pos, bit):
    s = Sealer(bytes(32))
    nonce, record = s.seal(data, AAD)
    assert s.open(record, AAD, nonce) == data
    tampered = bytearray(record)
    tampered[pos % len(record)] ^= 1 << bit
    with pytest.raises((RecordAuthError, NonceError)):
        s.open(bytes(tampered), AAD, nonce)


def test_open_into_wipes_output_on_failure():
    s = Sealer(os.urandom(32))
    nonce, record = s.seal(b"secret plaintext", AAD)
    out = memoryview(bytearray(b"\xff" * 16))
    s.open_into(record, AAD, nonce, out)
    assert bytes(out) == b"secret plaintext"
    bad = bytearray(record)
    bad[-1] ^= 1
    with pytest.raises(RecordAuthError):
        s.open_into(bytes(bad), AAD, nonce, out)
    assert bytes(out) == bytes(16)


def test_truncated_and_forgotten():
    s = Sealer(os.urandom(32))
    nonce, record = s.seal(b"hello", AAD)
    with pytest.raises(RecordAuthError):
        s.open(record[:20], AAD, nonce)
    with pytest.raises(RecordAuthError):
        s.open(record[:-1], AAD, nonce)
    s.forget()
    with pytest.raises(RuntimeError):
        s.open(record, AAD, nonce)
    assert "key" in repr(s) and "redacted" in repr(s)
