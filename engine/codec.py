"""Records to bytes and back (safetensors, in memory only) for the encrypted disk tier.

The payload describes itself: format version, kind, block and block size travel in the
safetensors metadata. Nothing here touches a file.
"""

from __future__ import annotations

import io

from .layout import CacheKind
from .records import RECORD_VERSION, Record

_TOKENS = "__tokens__"


class CodecError(ValueError):
    """A payload that is not a forkv record of this version."""


def encode(record: Record, block_size: int) -> bytes:
    import mlx.core as mx
    import numpy as np

    arrays = dict(record.arrays)
    arrays[_TOKENS] = mx.array(np.frombuffer(record.tokens, dtype="<i4"))
    meta = {"forkv_record": str(RECORD_VERSION), "kind": record.kind.value,
            "block": str(record.block), "block_size": str(block_size)}
    buf = io.BytesIO()
    mx.save_safetensors(buf, arrays, metadata=meta)
    return buf.getvalue()


def decode(data: bytes, block_size: int) -> Record:
    import mlx.core as mx
    import numpy as np

    try:
        arrays, meta = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
    except Exception as e:  # mlx raises plain RuntimeError/ValueError on bad bytes
        raise CodecError(f"not a safetensors payload: {e}") from e
    if meta.get("forkv_record") != str(RECORD_VERSION) or meta.get("block_size") != str(block_size):
        raise CodecError("record version or block size differs")
    tokens = arrays.pop(_TOKENS, None)
    if tokens is None:
        raise CodecError("record has no tokens")
    return Record(CacheKind(meta["kind"]), int(meta["block"]),
                  np.array(tokens, dtype="<i4").tobytes(), arrays)
