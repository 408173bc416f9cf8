"""Bounded fuzzing: a malformed record is a CodecError (a miss), a malformed store a
CorruptStoreError (or WrongKeyError), never anything else (issue 15, item 5)."""

import json
import os
import struct
from dataclasses import replace

import pytest
from forkv.engine.cache import codec
from forkv.engine.cache.records import Record
from forkv.security import BlobStore, CorruptStoreError, StoreSettings, WrongKeyError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
B = 4
META = {"forkv_record": "1", "kind": "state", "block": "0", "block_size": str(B)}


def payload(header: dict | str | bytes, body: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def decodes_or_misses(data: bytes) -> None:
    try:
        assert isinstance(codec.decode(data, B), Record)
    except codec.CodecError:
        pass


def tokens_entry(start=0):
    return {"dtype": "I32", "shape": [1], "data_offsets": [start, start + 4]}


@pytest.mark.parametrize(
    "data",
    [
        payload(b"[" * 100_000),  # RecursionError before
        payload(b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        payload(
            {
                "x": {"dtype": "F32", "shape": [0, 2**64], "data_offsets": [0, 0]},
                "__tokens__": tokens_entry(),
                "__metadata__": META,
            },
            b"\0" * 4,
        ),
        payload(
            {
                "x": {"dtype": "F32", "shape": [1] * 65 + [0], "data_offsets": [0, 0]},
                "__tokens__": tokens_entry(),
                "__metadata__": META,
            },
            b"\0" * 4,
        ),
        payload(
            {
                "x": {"dtype": "F32", "shape": [2**40, 0], "data_offsets": [0, 0]},
                "__tokens__": tokens_entry(),
                "__metadata__": META,
            },
            b"\0" * 4,
        ),
    ],
    ids=["deep-list", "deep-object", "shape-2**64", "65-dims", "shape-2**40"],
)
def test_hostile_record_headers_are_codec_errors(data):
    with pytest.raises(codec.CodecError):
        codec.decode(data, B)


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
dim = st.one_of(st.integers(0, 4), st.integers(-3, 2**70), st.sampled_from([2**31, 2**64]))
tensor = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "I32", "BOOL", "U8", "F64", 3, None]),
        "shape": st.lists(dim, max_size=70) | json_value,
        "data_offsets": st.lists(st.integers(-4, 64), min_size=0, max_size=3) | json_value,
    }
)


@FAST
@given(
    tensors=st.dictionaries(st.text(max_size=6), tensor | json_value, max_size=4),
    meta=st.none() | st.just(META) | json_value,
    body=st.binary(max_size=96),
)
def test_fuzzed_record_headers_decode_or_miss(tensors, meta, body):
    header = dict(tensors, __tokens__=tokens_entry(max(0, len(body) - 4)), __metadata__=meta)
    decodes_or_misses(payload(header, body))


@FAST
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_miss(data):
    decodes_or_misses(data)


# -- the persistent store: an index sealed under the right key, but malformed inside ---------


class Base:
    """A small persistent store: its key and its bytes (short repr for hypothesis reports)."""

    def __init__(self, key: bytes, raw: bytes) -> None:
        self.key, self.raw = key, raw

    def copy_to(self, path, raw: bytes | None = None):
        path.write_bytes(self.raw if raw is None else raw)
        os.chmod(path, 0o600)
        return path

    def __repr__(self) -> str:
        return f"Base(<{len(self.raw)} bytes>)"


def store_settings(path, key):
    return StoreSettings.from_env({}, persist_path=str(path), key=key, handle_signals=False)


def seal_index(path, key, plain: bytes) -> None:
    """Replace the store's index by ``plain``, sealed and pointed at as forkv would."""
    from forkv.security.header import checked_bytes
    from forkv.security.persist import _INDEX_AAD, _write_header

    store = BlobStore(store_settings(path, key))
    df = store._file
    salt = df.session_salts[df.current]
    offset = df.alloc.allocate(len(plain) + 64)
    nonce, size = df.write_blob(offset, plain, _INDEX_AAD + checked_bytes(df.header) + salt)
    _write_header(df, replace(df.header, index_offset=offset, index_length=size,
                              index_salt=salt, index_nonce=nonce))  # fmt: skip
    store._dirty = False
    store.close()  # nothing dirty: the sealed index stays as written


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "s.fkv"
    key = os.urandom(32)
    with BlobStore(store_settings(path, key)) as store:
        for i in range(3):
            store.put(b"k%d" % i, "state", os.urandom(100))
    return Base(key, path.read_bytes())


def opens_or_is_corrupt(path, key) -> None:
    try:
        BlobStore(store_settings(path, key)).close()
    except CorruptStoreError:
        pass


@pytest.mark.parametrize(
    "plain",
    [
        b"[" * 100_000,  # RecursionError before
        b'{"version":1,"next_generation":1e400,"sessions":[],"entries":[]}',  # OverflowError
        b'{"version":1,"next_generation":2,"sessions":["' + b"00" * 32 + b'"],'
        b'"entries":[["6b",["state"],4096,64,10,"' + b"00" * 12 + b'",1,0,{}]]}',
        b'{"version":1,"next_generation":2,"sessions":["' + b"00" * 32 + b'"],'
        b'"entries":[["6b","state",4096,0,0,"' + b"00" * 12 + b'",1,0,{}]]}',  # zero extent
    ],
    ids=["deep", "inf", "kind-list", "zero-extent"],
)
def test_hostile_index_is_corrupt_store(tmp_path, base_store, plain):
    path = base_store.copy_to(tmp_path / "s.fkv")
    seal_index(path, base_store.key, plain)
    with pytest.raises(CorruptStoreError):
        BlobStore(store_settings(path, base_store.key))


row = st.lists(json_value | st.integers(0, 1 << 20), min_size=9, max_size=9)


@FAST
@given(
    doc=st.fixed_dictionaries(
        {
            "version": st.sampled_from([1, 2, "1"]),
            "next_generation": st.integers(-2, 2**64) | json_value,
            "sessions": st.lists(st.sampled_from(["00" * 32, "zz", "00"]), max_size=3) | json_value,
            "entries": st.lists(row, max_size=3) | json_value,
        }
    )
    | json_value
)
def test_fuzzed_index_opens_or_is_corrupt(tmp_path_factory, base_store, doc):
    path = base_store.copy_to(tmp_path_factory.mktemp("f") / "s.fkv")
    seal_index(path, base_store.key, json.dumps(doc).encode())
    opens_or_is_corrupt(path, base_store.key)


@FAST
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1, max_size=6))
def test_fuzzed_header_is_refused_or_opens(tmp_path_factory, base_store, edits):
    raw = bytearray(base_store.raw)
    for pos, value in edits:
        raw[pos] = value
    path = base_store.copy_to(tmp_path_factory.mktemp("h") / "s.fkv", bytes(raw))
    try:
        BlobStore(store_settings(path, base_store.key)).close()
    except (CorruptStoreError, WrongKeyError):
        return
    assert raw[:4096] == base_store.raw[:4096]  # only an unchanged header opens
