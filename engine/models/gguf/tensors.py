"""GGUF tensor data to float32 numpy arrays, and float32 to a storage dtype.

Dequantizes the types llama.cpp writes for dense text models (F32, F16, BF16, Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0 and the K-quants Q2_K..Q6_K) with gguf-py's reference kernels, in row chunks
so a large tensor never needs several float32 copies at once. Knows nothing about tensor
names or models (archs.py) or files on disk beyond one tensor's bytes (header.py).
"""

from __future__ import annotations

import numpy as np

from .header import GGUFError, GGUFHeader, TensorInfo, read_tensor_bytes

__all__ = ["STORAGE_DTYPES", "SUPPORTED_TYPES", "dequantize", "to_storage"]

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# storage dtype name -> safetensors dtype tag
STORAGE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_CHUNK_ELEMENTS = 1 << 22  # dequantize 4M elements (16 MiB of float32) at a time


def dequantize(header: GGUFHeader, info: TensorInfo, f=None) -> np.ndarray:
    """The tensor as a float32 array of `info.shape` (numpy order)."""
    name = info.type_name
    if name not in SUPPORTED_TYPES:
        raise GGUFError(f"GGUF file {header.path}: tensor {info.name!r} has type {name}, which "
                        f"forkv cannot convert; supported: {', '.join(SUPPORTED_TYPES)}.")
    raw = np.frombuffer(read_tensor_bytes(header, info, f), np.uint8)
    if name == "F32":
        return raw.view("<f4").reshape(info.shape)
    if name == "F16":
        return raw.view("<f2").astype(np.float32).reshape(info.shape)
    if name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
    return _dequantize_blocks(raw, info)


def _dequantize_blocks(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize
    except ImportError:
        raise GGUFError("converting a quantized GGUF file needs the gguf package; "
                        "install it with `pip install gguf`.") from None
    qtype = GGMLQuantizationType[info.type_name]
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    num_blocks = raw.size // block_bytes
    blocks = raw.reshape(num_blocks, block_bytes)
    out = np.empty(num_blocks * block, np.float32)
    step = max(1, _CHUNK_ELEMENTS // block)
    for start in range(0, num_blocks, step):
        part = blocks[start:start + step]
        out[start * block:(start + len(part)) * block] = gguf_dequantize(part, qtype).reshape(-1)
    return out.reshape(info.shape)


def to_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    """`a` (float32) cast to `dtype`; bfloat16 comes back as its uint16 bit pattern (numpy has
    no bfloat16), rounded to nearest even like mlx and torch."""
    assert a.dtype == np.float32, a.dtype
    if dtype == "float32":
        return np.ascontiguousarray(a)
    if dtype == "float16":
        return a.astype(np.float16)
    assert dtype == "bfloat16", dtype
    u = np.ascontiguousarray(a).view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():  # rounding could carry a NaN's payload into the exponent
        bits[nan] = 0x7FC0
    return bits
