"""GGUF's quantized blocks as mlx affine-quantized tensors, exactly.

mlx's affine format is `w = scale * q + bias` with q unsigned in [0, 2^bits) and one
(scale, bias) per group of `GROUP_SIZE` (32) values along a row, q packed into uint32 words as
one little-endian bit stream per row (what `mx.quantize` writes, for every bit width). Every
llama.cpp type whose groups are 32 wide with a plain scale and offset maps onto it:

    Q8_0  d, 32 x int8        bits 8   q = int8 + 128   scale d       bias -128 d
    Q4_0  d, 32 x 4-bit       bits 4                    scale d       bias -8 d
    Q4_1  d, m, 32 x 4-bit    bits 4                    scale d       bias m
    Q5_0  d, 32 x 5-bit       bits 5                    scale d       bias -16 d
    Q5_1  d, m, 32 x 5-bit    bits 5                    scale d       bias m
    Q4_K  d, dmin; 8 x (6-bit sc, m, 32 x 4-bit)  bits 4  scale d sc  bias -(dmin m)
    Q5_K  the same with 5-bit q                    bits 5

`mx.dequantize` of the result equals gguf-py's `dequantize` (what the float converter
stores) value for value in float32: every product `scale * q` is exact (an f16 times at most
a 6-bit scale times at most 8 bits fits float32's 24), so the one rounding is the same add
or subtract gguf-py does. One exception in bits, not value, for the offset types (Q8_0,
Q4_0, Q5_0): where a value is zero and d < 0, gguf-py's `d * (q - 8)` is -0.0 while
`d * q + (-8 d)` cancels exactly to +0.0 (no sum of opposites rounds to -0.0).

Q6_K maps the same way onto groups of 16 (`KERNEL_ONLY`): each 16-value sub-block is
`d * sc * (q - 32)` with an int8 sc, so scale `d sc` and bias `-32 d sc` (exact products:
11 + 7 + 6 significant bits), q its 6 bits. mlx's smallest group is 32, so these triples are
for forkv's kernels only; the converter stores them beside the float tensor.

Not mapped (`to_affine` returns None; the converter keeps them float): Q2_K and Q3_K (16-wide
sub-blocks, Q3_K's signed scales), float types, and anything not 2-D. Knows block layouts and
mlx's packing; not names or files.
"""

from __future__ import annotations

import numpy as np

from .header import GGML_TYPES, TensorInfo

__all__ = ["AFFINE_BITS", "GROUP_SIZE", "KERNEL_ONLY", "affine_bits", "group_size", "k_params",
           "pack", "to_affine"]

GROUP_SIZE = 32
AFFINE_BITS = {"Q8_0": 8, "Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q5_K": 5,
               "Q6_K": 6}
KERNEL_ONLY = {"Q6_K": 16}  # type -> its group size, which mlx cannot hold
_CHUNK_ELEMENTS = 1 << 22  # decode 4M values at a time: the uint64 packing temp is 32 MiB
_F32 = np.float32


def affine_bits(info: TensorInfo) -> int | None:
    """The bit width `to_affine` maps `info` to, or None if it keeps the tensor float (known
    from the type and shape alone, so a conversion can plan its shards before reading)."""
    return AFFINE_BITS.get(info.type_name) if len(info.shape) == 2 else None


def group_size(info: TensorInfo) -> int:
    """The group size `to_affine` maps `info` to: 32, or 16 for the `KERNEL_ONLY` types."""
    return KERNEL_ONLY.get(info.type_name, GROUP_SIZE)


def to_affine(info: TensorInfo, raw_bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     int, int] | None:
    """(weight uint32 (rows, cols * bits / 32), scales float32 (rows, cols / group), biases
    float32, bits, group size) holding exactly the values of one GGUF tensor, or None if its
    type does not map (see the module docstring)."""
    bits = affine_bits(info)
    if bits is None:
        return None
    group = group_size(info)
    rows, cols = info.shape
    _, block, block_bytes = GGML_TYPES[info.ggml_type]
    raw = np.frombuffer(raw_bytes, np.uint8)
    assert raw.size == info.nbytes, (info.name, raw.size, info.nbytes)
    blocks = raw.reshape(-1, block_bytes)
    weight = np.empty(rows * cols * bits // 32, "<u4")
    scales = np.empty(rows * cols // group, _F32)
    biases = np.empty_like(scales)
    decode = _DECODERS[info.type_name]
    step = max(1, _CHUNK_ELEMENTS // block)
    # Rows are whole multiples of 32 values (bits * 4 bytes), so packing the flat stream in
    # chunks of whole blocks gives each row's words exactly as packing it alone would.
    for start in range(0, len(blocks), step):
        q, s, b = decode(blocks[start:start + step])
        g, n = start * block // group, s.size
        scales[g:g + n], biases[g:g + n] = s.reshape(-1), b.reshape(-1)
        w = pack(q.reshape(-1), bits)
        weight[start * block * bits // 32:][:w.size] = w
    return (weight.reshape(rows, -1), scales.reshape(rows, -1), biases.reshape(rows, -1),
            bits, group)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `q` (last axis a multiple of 32 / gcd(bits, 32) values) packed as mlx packs:
    value i of a row at bits [bits * i, bits * (i + 1)) of the row's little-endian bit stream,
    read as uint32 words. Eight values fill exactly `bits` bytes, for any bits up to 8."""
    q = np.asarray(q)
    *lead, n = q.shape
    assert 1 <= bits <= 8 and n * bits % 32 == 0, (q.shape, bits)
    eights = q.reshape(-1, 8)
    acc = np.zeros(len(eights), "<u8")
    for i in range(8):
        acc |= (eights[:, i].astype("<u8") & np.uint64((1 << bits) - 1)) << np.uint64(bits * i)
    packed = np.ascontiguousarray(acc.view(np.uint8).reshape(-1, 8)[:, :bits]).reshape(-1)
    return packed.view("<u4").reshape(*lead, n * bits // 32)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block, as float32 (n, 1)."""
    return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(_F32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 4-bit layout: byte j holds value j (low nibble) and value j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1: bit j of the little-endian uint32 `qh` is value j's fifth bit, as 0x10."""
    word = np.ascontiguousarray(qh).view("<u4")  # (n, 1)
    return (((word >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q8_0(b):  # d (2) qs (32)
    d = _f16(b, 0)
    return b[:, 2:] ^ np.uint8(0x80), d, d * _F32(-128)  # int8 x + 128 is its bits ^ 0x80


def _q4_0(b):  # d (2) qs (16)
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d, d * _F32(-8)


def _q4_1(b):  # d (2) m (2) qs (16)
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b):  # d (2) qh (4) qs (16)
    d = _f16(b, 0)
    return _nibbles(b[:, 6:22]) | _high_bits(b[:, 2:6]), d, d * _F32(-16)


def _q5_1(b):  # d (2) m (2) qh (4) qs (16)
    return _nibbles(b[:, 8:24]) | _high_bits(b[:, 4:8]), _f16(b, 0), _f16(b, 2)


def _k_sc_m(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 8 six-bit (sc, m) pairs per super-block (uint8 (n, 8) each), from the 12
    bytes after d (2) and dmin (2), unpacked as gguf-py's `Q4_K.get_scale_min` does."""
    n = len(b)
    lo, mid, top = (b[:, 4:16].reshape(n, 3, 4)[:, i] for i in range(3))
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    m = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc, m


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d * sc and -(dmin * m) per 32-value sub-block (n, 8): Q4_K / Q5_K's super-block header
    (`_k_sc_m`), multiplied in gguf-py's float32 order."""
    sc, m = _k_sc_m(b)
    return _f16(b, 0) * sc.astype(_F32), -(_f16(b, 2) * m.astype(_F32))


def _k_low(qs: np.ndarray) -> np.ndarray:
    """The K-quants' 4-bit layout: 32 bytes per pair of sub-blocks, low nibbles the first."""
    n = len(qs)
    return np.stack([qs.reshape(n, 4, 32) & 0x0F, qs.reshape(n, 4, 32) >> 4], axis=2)


def _q4_k(b):  # d (2) dmin (2) scales (12) qs (128)
    scale, bias = _k_scales(b)
    return _k_low(b[:, 16:144]).reshape(len(b), 256), scale, bias


def _q5_k(b):  # d (2) dmin (2) scales (12) qh (32) qs (128)
    n = len(b)
    scale, bias = _k_scales(b)
    # Sub-block j takes its fifth bits from bit j of the 32 qh bytes.
    high = ((b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4
    q = _k_low(b[:, 48:176]).reshape(n, 8, 32) | high
    return q.reshape(n, 256), scale, bias


def _q6_k(b):  # ql (128) qh (64) scales (16 x int8) d (2); 16 groups of 16
    n = len(b)
    ql, qh = b[:, :128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
    # Per 128-value half, as ggml lays it out: values l, l + 32, l + 64, l + 96 take ql[l] /
    # ql[l + 32]'s low then high nibbles and bits 0-1, 2-3, 4-5, 6-7 of qh[l].
    low = np.concatenate([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4,
                          ql[..., 32:] >> 4], axis=-1)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    scale = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(_F32)
    return (low | (high << 4)).reshape(n, 256), scale, scale * _F32(-32)


def k_params(info: TensorInfo, raw_bytes) -> np.ndarray | None:
    """A Q4_K, Q5_K or Q6_K tensor's super-block params as forkv's kernels read them (uint8
    (rows, cols / 256 * 20 or 18); qgemm.h's `kparams_bytes`): Q4_K / Q5_K's f16 d and dmin and
    their 8 six-bit (sc, m) pairs unpacked to bytes, Q6_K's f16 d and 16 int8 sc; each group's
    `to_affine` scale is d * sc and bias -(dmin * m) (Q6_K: -32 d sc), exact products. None
    for other types."""
    kind = info.type_name
    if kind not in ("Q4_K", "Q5_K", "Q6_K") or len(info.shape) != 2:
        return None
    _, block, block_bytes = GGML_TYPES[info.ggml_type]
    b = np.frombuffer(raw_bytes, np.uint8).reshape(-1, block_bytes)
    if kind == "Q6_K":  # d is the block's last two bytes, the 16 int8 sc before it
        out = np.concatenate([b[:, 208:210], b[:, 192:208]], axis=1)
    else:
        out = np.concatenate([b[:, 0:4], *_k_sc_m(b)], axis=1)
    rows, cols = info.shape
    return np.ascontiguousarray(out).reshape(rows, cols // block * out.shape[1])


_DECODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
