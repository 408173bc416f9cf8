"""Attention on forkv's kernels, for the models whose matmuls already run on them.

mlx-lm's attention modules call `scaled_dot_product_attention`, a name each model module
imports from mlx_lm.models.base. `use_native_attention(model, lib)` gives the model's own
attention modules a subclass whose `__call__` is theirs with that name bound to `attention`
below, and which marks their calls (swap.marked_subclass; the model's module is left alone).
Marked calls on float32 queries (K/V float32, or half width or q8_0 as native/kvcache.py
stores them), decode and prefill alike
(no mask, mlx-lm's "causal", or an array mask such as a sliding window's), go to the kernel;
every other call (other models in the process, bfloat16, quantized caches, attention sinks)
goes to mlx-lm's function unchanged. So the kernel path is scoped to the models whose
fingerprint already names the kernels. The kernel computes each query row on its own, so a
prefill row gives the same bits as a decode step over the same keys.
"""

from __future__ import annotations

import contextvars

import mlx.core as mx

from .swap import marked_subclass

__all__ = ["attention", "use_native_attention", "uses_native_attention"]

_MARKED = contextvars.ContextVar("forkv_native_attention", default=None)
_NAME = "scaled_dot_product_attention"
_subclasses: dict[type, type] = {}


def _mlx_lm_sdpa():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def _sdpa_functions() -> tuple:
    """The functions attention modules call by that name: mlx-lm's, and mlx-vlm's (its
    language models import their own, which adds caches forkv does not make). A vision
    model's text attention on mlx's CPU kernel gives other sums for a chunk than for one row
    on some BLAS builds (OpenBLAS's Haswell kernels), so its verifies could not be exact."""
    found = [_mlx_lm_sdpa()]
    try:
        from mlx_vlm.models import base as vlm_base
    except ImportError:
        return tuple(found)
    fn = getattr(vlm_base, _NAME, None)
    return tuple(found + [fn]) if fn is not None and fn is not found[0] else tuple(found)


def attention(queries, keys, values, cache, scale, mask, sinks=None):
    """A marked module's scaled_dot_product_attention on the kernel; other calls go to
    mlx-lm's."""
    lib = _MARKED.get()
    q8 = keys.dtype == mx.uint8 and values.dtype == mx.uint8  # q8_0 rows (kvcache.py)
    if (lib is not None and sinks is None and not hasattr(cache, "bits")
            and queries.ndim == 4 and keys.shape == values.shape
            and queries.shape[2] <= keys.shape[2]
            and keys.shape[-1] == (_q8_width(queries.shape[-1]) if q8 else queries.shape[-1])
            and queries.shape[-1] % 16 == 0
            and queries.shape[1] % keys.shape[1] == 0
            and queries.dtype == mx.float32 and keys.dtype == values.dtype
            and keys.dtype in (mx.float32, mx.float16, mx.bfloat16, mx.uint8)
            and (mask is None or isinstance(mask, mx.array) or mask == "causal")):
        if isinstance(mask, str):  # "causal": row i sees keys up to S - L + i
            return lib.attention(queries, keys, values, scale, None, queries.shape[2] > 1)
        return lib.attention(queries, keys, values, scale, mask, False,
                             _ring_rotation(cache, queries.shape[2], keys.shape[2]))
    if q8:  # mlx-lm's attention reads float K/V
        from .kvcache import dequantize_q8

        keys, values = dequantize_q8(keys), dequantize_q8(values)
    return _mlx_lm_sdpa()(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _q8_width(head_dim: int) -> int:
    """Bytes of one q8_0 K/V row (-1, matching nothing, where head_dim is not whole groups)."""
    from .kvcache import Q8_GROUP, Q8_GROUP_BYTES

    return head_dim // Q8_GROUP * Q8_GROUP_BYTES if head_dim % Q8_GROUP == 0 else -1


def _ring_rotation(cache, num_rows: int, num_keys: int) -> int:
    """Where a decode step's keys start in time order, for a sliding window's wrapped ring.

    mlx-lm's rotating caches hand a decode step their whole ring, whose oldest key sits at
    `_idx` (the slot after the newest). Reading it from there puts every key in the block and
    lane it has in a prefill, so the step gives the bits of that prefill's row.
    """
    if num_rows != 1 or getattr(cache, "keep", 0) or not hasattr(cache, "max_size"):
        return 0
    idx = getattr(cache, "_idx", 0)
    return idx % num_keys if isinstance(idx, int) and num_keys else 0


def _calls_sdpa(cls: type) -> bool:
    call = getattr(cls, "__call__", None)
    code = getattr(call, "__code__", None)
    return (code is not None and _NAME in code.co_names
            and any(call.__globals__.get(_NAME) is fn for fn in _sdpa_functions()))


def uses_native_attention(model) -> bool:
    """Whether `use_native_attention` marked any of `model`'s modules."""
    marked = set(_subclasses.values())
    return any(type(m) in marked for _, m in model.named_modules())


def use_native_attention(model, lib) -> int:
    """Route `model`'s attention to the kernel; returns how many modules it marked."""
    count = 0
    for _, m in model.named_modules():
        cls = type(m)
        if cls in _subclasses.values():
            count += 1
            continue
        if not _calls_sdpa(cls):
            continue
        m.__class__ = marked_subclass(cls, {_NAME: attention}, _MARKED, _subclasses)
        m._forkv_lib = lib
        count += 1
    return count
