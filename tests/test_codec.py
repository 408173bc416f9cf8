"""codec: records round-trip bit-exactly; any malformed payload is a CodecError, nothing else."""

import io
import json
import random
import struct

import mlx.core as mx
import numpy as np
import pytest
from forkv.engine.cache import codec
from forkv.engine.cache.layout import CacheKind
from forkv.engine.cache.records import RECORD_VERSION, Record

B = 4


def _record(kind=CacheKind.WINDOW, block=2):
    arrays = {
        "0.k": mx.random.normal((1, 2, 3, 5)).astype(mx.bfloat16),  # odd byte sizes: unaligned
        "0.v": mx.random.normal((1, 2, 3, 5)).astype(mx.float16),
        "1.k": mx.random.normal((2, 3)),
        "1.s0": mx.arange(7, dtype=mx.int32),
        "1.s1": mx.arange(3, dtype=mx.int64),
        "2.s0": mx.array([True, False, True]),
        "2.s1": mx.array([1, 2, 255], dtype=mx.uint8),
        "3.s0": mx.zeros((0, 4), mx.float32),
        "3.s1": mx.array(2.5),  # shape ()
        "4.s0": mx.array([1 + 2j, 3 - 1j], dtype=mx.complex64),
    }
    return Record(kind, block, np.arange(B, dtype="<i4").tobytes(), arrays)


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == mx.bfloat16:  # numpy has no bfloat16: compare the bits
        a, b = a.view(mx.uint16), b.view(mx.uint16)
    np.testing.assert_array_equal(np.array(a), np.array(b))


def _meta(data):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _payload(header, body):
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def test_roundtrip_every_dtype_bit_exact():
    record = _record()
    back = codec.decode(codec.encode(record, B), B)
    assert (back.kind, back.block, back.tokens) == (record.kind, record.block, record.tokens)
    assert set(back.arrays) == set(record.arrays)
    for name, a in record.arrays.items():
        _same(back.arrays[name], a)


def test_decoded_arrays_do_not_alias_the_input_buffer():
    record = _record()
    scratch = bytearray(codec.encode(record, B))
    back = codec.decode(memoryview(scratch), B)
    scratch[:] = b"\xa5" * len(scratch)  # the caller reuses its buffer for the next record
    for name, a in record.arrays.items():
        _same(back.arrays[name], a)


def test_payloads_of_the_old_encoder_still_decode():
    # The format of records already on disk: mx.save_safetensors, tensors in name order.
    record = _record(CacheKind.STATE, 5)
    arrays = dict(record.arrays, __tokens__=mx.array(np.frombuffer(record.tokens, "<i4")))
    buf = io.BytesIO()
    meta = {"forkv_record": str(RECORD_VERSION), "kind": "state", "block": "5",
            "block_size": str(B)}
    mx.save_safetensors(buf, arrays, metadata=meta)
    back = codec.decode(buf.getvalue(), B)
    assert back.kind == CacheKind.STATE and back.block == 5 and back.tokens == record.tokens
    for name, a in record.arrays.items():
        _same(back.arrays[name], a)


def test_encoded_payloads_load_with_mx_load():
    record = _record()
    arrays, meta = mx.load(io.BytesIO(codec.encode(record, B)), format="safetensors",
                           return_metadata=True)
    assert meta["kind"] == "window" and meta["block_size"] == str(B)
    for name, a in record.arrays.items():
        _same(arrays[name], a)


def _bad_payloads():
    good = codec.encode(_record(), B)
    header, body = _meta(good)
    name = "1.k"

    def edit(fn):
        h = json.loads(json.dumps(header))
        fn(h)
        return _payload(h, body)

    yield "empty", b""
    yield "short", good[:7]
    yield "huge header length", struct.pack("<Q", 1 << 60) + good[8:]
    yield "header past end", struct.pack("<Q", len(good)) + good[8:]
    yield "not json", struct.pack("<Q", 4) + b"\xff\xfe{]" + body
    yield "json list", _payload([1, 2], body)
    yield "trailing bytes", good + b"\0"
    yield "truncated body", good[:-1]
    yield "unknown dtype", edit(lambda h: h[name].update(dtype="F64"))
    yield "dtype not a string", edit(lambda h: h[name].update(dtype=["F32"]))
    yield "shape too big", edit(lambda h: h[name].update(shape=[2, 4]))
    yield "negative dim", edit(lambda h: h[name].update(shape=[-2, -3]))
    yield "bool dim", edit(lambda h: h[name].update(shape=[True, 6]))
    yield "float offsets", edit(lambda h: h[name].update(data_offsets=[0.0, 24.0]))
    yield "offsets swapped", edit(lambda h: h[name].update(
        data_offsets=h[name]["data_offsets"][::-1]))
    yield "extra field", edit(lambda h: h[name].update(extra=1))
    yield "missing field", edit(lambda h: h[name].pop("shape"))
    yield "entry not a dict", edit(lambda h: h.update({name: 3}))
    yield "overlap", edit(lambda h: h["0.k"].update(data_offsets=h["0.v"]["data_offsets"]))
    yield "metadata not strings", edit(lambda h: h["__metadata__"].update(block=3))
    yield "no tokens", edit(lambda h: h.pop("__tokens__"))
    yield "tokens not int32", edit(lambda h: h["__tokens__"].update(dtype="F32"))
    yield "wrong version", edit(lambda h: h["__metadata__"].update(forkv_record="99"))
    yield "wrong block size", edit(lambda h: h["__metadata__"].update(block_size="8"))
    yield "unknown kind", edit(lambda h: h["__metadata__"].update(kind="nope"))
    yield "block not a number", edit(lambda h: h["__metadata__"].update(block="x"))
    off = 8 + len(json.dumps(header).encode())
    bad_bool = bytearray(_payload(header, body))
    bad_bool[off + header["2.s0"]["data_offsets"][0]] = 2
    yield "bool holds 2", bytes(bad_bool)


@pytest.mark.parametrize("why,data", list(_bad_payloads()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_bad_payloads_raise_codec_error(why, data):
    with pytest.raises(codec.CodecError):
        codec.decode(data, B)


def test_random_corruption_is_codec_error_or_a_record():
    good = codec.encode(_record(), B)
    n = struct.unpack("<Q", good[:8])[0]
    rng = random.Random(0)
    for i in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):  # mostly in the header, where parsing happens
            data[rng.randrange(8 + n if i % 4 else len(data))] = rng.randrange(256)
        if i % 7 == 0:
            data = data[:rng.randrange(len(data))]
        try:
            back = codec.decode(bytes(data), B)
        except codec.CodecError:
            continue
        assert isinstance(back, Record)  # AES-GCM, not the codec, catches changed bytes
