"""Blob/StoreStats shapes and argument checks: slots, zero-copy holding of bytes."""

import pickle

import pytest
from forkv.security import Blob
from forkv.security.blob import check_slot, hold_bytes


def test_hold_bytes_zero_copy_for_immutable_only():
    data = b"x" * 1000
    assert hold_bytes(data) is data
    assert hold_bytes(memoryview(data)) is data
    part = hold_bytes(memoryview(data)[10:20])
    assert part == b"x" * 10
    buf = bytearray(b"abc")
    held = hold_bytes(buf)
    buf[0] = ord("z")  # the caller may reuse its buffer right after put
    assert held == b"abc"


def test_check_slot():
    assert check_slot(bytearray(b"k"), "global") == (b"k", "global")
    for key, kind in [("str", "g"), (b"", "g"), (b"k" * 2000, "g"), (b"k", ""), (b"k", "x" * 100)]:
        with pytest.raises((TypeError, ValueError)):
            check_slot(key, kind)


def test_blob_repr_hides_payload_and_pickles():
    blob = Blob(b"secret" * 100, {"a": "b"})
    assert "secret" not in repr(blob) and "600 bytes" in repr(blob)
    assert pickle.loads(pickle.dumps(blob)) == blob
