"""Records to bytes and back (safetensors, in memory only) for the encrypted disk tier.

The payload describes itself: format version, kind, block and block size travel in the
safetensors metadata. Nothing here touches a file. `decode` parses the header itself and
checks it strictly (a bad payload raises CodecError, never returns wrong data); each array is
copied once from the payload into memory mlx owns, so the caller may reuse its buffer at once.
"""

from __future__ import annotations

import functools
import json
import math

from forkv.errors import ForkvError

from .kinds import record_names
from .records import RECORD_VERSION, Record

_TOKENS = "__tokens__"
_MAX_HEADER = 16 << 20  # a record of a few hundred arrays has a header of a few KB
_MAX_DIMS = 16  # cache arrays have 4 or 5; numpy refuses more than 64
_MAX_DIM = (1 << 31) - 1
# safetensors dtype -> (numpy dtype, item size, mlx dtype; the bytes are viewed as that mlx
# dtype after loading where numpy has none of its own: bfloat16)
_DTYPES = {
    "BOOL": ("?", 1, "bool_"), "U8": ("u1", 1, "uint8"), "I8": ("i1", 1, "int8"),
    "U16": ("<u2", 2, "uint16"), "I16": ("<i2", 2, "int16"), "F16": ("<f2", 2, "float16"),
    "BF16": ("<u2", 2, "bfloat16"), "U32": ("<u4", 4, "uint32"), "I32": ("<i4", 4, "int32"),
    "F32": ("<f4", 4, "float32"), "U64": ("<u8", 8, "uint64"), "I64": ("<i8", 8, "int64"),
    "C64": ("<c8", 8, "complex64"),
}  # fmt: skip


@functools.cache
def _names() -> dict:
    """mlx dtype -> safetensors dtype name (mlx is imported lazily)."""
    import mlx.core as mx

    return {getattr(mx, mlx_name): name for name, (_, _, mlx_name) in _DTYPES.items()}


class CodecError(ForkvError, ValueError):
    """A payload that is not a forkv record of this version."""


def encode(record: Record, block_size: int) -> bytes:
    """The record as one safetensors payload, built with a single allocation of its exact
    size (records of several MB are written per block: growing buffers would fragment the
    heap and hold RAM the OS never gets back)."""
    import numpy as np

    names = sorted(record.arrays)
    views, entries, offset = [], {}, 0
    for name in names:
        arr, dtype = _as_numpy(record.arrays[name])
        views.append(arr.reshape(-1).view(np.uint8))
        entries[name] = {"dtype": dtype, "shape": list(arr.shape),
                         "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    tokens = record.tokens
    entries[_TOKENS] = {"dtype": "I32", "shape": [len(record.tokens) // 4],
                        "data_offsets": [offset, offset + len(tokens)]}
    entries["__metadata__"] = {"forkv_record": str(RECORD_VERSION), "kind": str(record.kind),
                               "block": str(record.block), "block_size": str(block_size),
                               "namespace": record.namespace.hex()}
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads the header to 8 bytes
    return b"".join([len(header).to_bytes(8, "little"), header, *views, tokens])


def _as_numpy(arr):
    """A row-major numpy view (or copy) of an mlx array and its safetensors dtype name."""
    import mlx.core as mx
    import numpy as np

    name = _names().get(arr.dtype)
    if name is None:
        raise CodecError(f"cannot store arrays of dtype {arr.dtype}")
    if arr.dtype == mx.bfloat16:
        arr = arr.view(mx.uint16)
    return np.require(np.asarray(arr), requirements="C"), name


def decode(data, block_size: int) -> Record:
    """The record in `data` (any contiguous buffer: bytes, bytearray, memoryview).

    Whatever the bytes, the result is a checked record or a CodecError (a miss for the caller):
    the checks below bound every field, and anything they miss is still mapped here.
    """
    try:
        return _decode(data, block_size)
    except CodecError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise CodecError(f"malformed record payload ({type(e).__name__})") from None


def _decode(data, block_size: int) -> Record:
    view = memoryview(data).cast("B")
    tensors, meta, start = _parse_header(view)
    if meta.get("forkv_record") != str(RECORD_VERSION) or meta.get("block_size") != str(block_size):
        raise CodecError("record version or block size differs")
    kind = meta.get("kind")
    try:
        block = int(meta.get("block", ""))
    except ValueError:
        raise CodecError("record kind or block is malformed") from None
    if kind not in record_names():
        raise CodecError("record kind or block is malformed")
    tok = tensors.pop(_TOKENS, None)
    if tok is None or tok[0] != "I32" or len(tok[1]) != 1:
        raise CodecError("record has no tokens")
    tokens = bytes(view[start + tok[2]:start + tok[3]])
    try:
        namespace = bytes.fromhex(meta.get("namespace", ""))
    except ValueError:
        raise CodecError("record namespace is malformed") from None
    arrays = {name: _to_array(view, start, *t) for name, t in tensors.items()}
    return Record(kind, block, tokens, arrays, namespace)


def _parse_header(view: memoryview) -> tuple[dict, dict, int]:
    """(name -> (dtype, shape, begin, end), metadata, payload start), all checked."""
    if len(view) < 8:
        raise CodecError("not a safetensors payload: too short")
    n = int.from_bytes(view[:8], "little")
    if n > min(_MAX_HEADER, len(view) - 8):
        raise CodecError("not a safetensors payload: header length out of range")
    try:
        header = json.loads(bytes(view[8:8 + n]))
    except (UnicodeDecodeError, ValueError, RecursionError):  # deep nesting: RecursionError
        raise CodecError("not a safetensors payload: header is not JSON") from None
    if not isinstance(header, dict):
        raise CodecError("not a safetensors payload: header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CodecError("metadata is not a string map")
    start, size = 8 + n, len(view) - 8 - n
    tensors, end = {}, 0
    # mlx writes tensors back to back in offset order; anything else (gaps, overlaps, bytes
    # past the last tensor) is not a payload we wrote.
    for name, info in sorted(header.items(), key=lambda kv: _begin(kv[1])):
        dtype, shape, begin, stop = _check_tensor(name, info)
        if begin != end or stop > size:
            raise CodecError(f"tensor {name!r} has offsets out of order or out of range")
        tensors[name], end = (dtype, shape, begin, stop), stop
    if end != size:
        raise CodecError("payload has bytes no tensor describes")
    return tensors, meta, start


def _begin(info) -> tuple:
    try:
        begin, stop = info["data_offsets"]
        return int(begin), int(stop)  # empty tensors sort before the one that starts there
    except (TypeError, KeyError, ValueError):
        return -1, -1  # sorts first; _check_tensor then names the fault


def _is_int(x) -> bool:
    return type(x) is int and x >= 0


def _is_dim(x) -> bool:
    # mlx shapes are int32; a zero elsewhere in the shape must not hide a 2**64 here
    return _is_int(x) and x <= _MAX_DIM


def _check_tensor(name: str, info) -> tuple[str, tuple, int, int]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise CodecError(f"tensor {name!r} entry is malformed")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise CodecError(f"tensor {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(map(_is_dim, shape)):
        raise CodecError(f"tensor {name!r} has a malformed shape")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets)):
        raise CodecError(f"tensor {name!r} has malformed offsets")
    begin, stop = offsets
    if stop - begin != math.prod(shape) * _DTYPES[dtype][1]:
        raise CodecError(f"tensor {name!r}: offsets do not match shape and dtype")
    return dtype, tuple(shape), begin, stop


def _to_array(view: memoryview, start: int, dtype: str, shape: tuple, begin: int, stop: int):
    import mlx.core as mx
    import numpy as np

    np_dtype = _DTYPES[dtype][0]
    a = np.frombuffer(view, np_dtype, math.prod(shape), start + begin).reshape(shape)
    if dtype == "BOOL" and a.view("u1").max(initial=0) > 1:
        raise CodecError("bool tensor holds values other than 0 and 1")
    out = mx.array(a)  # the one copy: into memory mlx owns, so `view` can be reused at once
    return out.view(mx.bfloat16) if dtype == "BF16" else out
