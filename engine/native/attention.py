"""Decode attention on forkv's kernels, for the models whose matmuls already run on them.

mlx-lm's attention modules call `scaled_dot_product_attention`, a name each model module
imports from mlx_lm.models.base. `use_native_attention(model, lib)` points that name, in the
modules that import it, at `attention` below, and gives the model's own attention modules a
subclass that marks their calls. Only marked calls of one token per sequence on float32
queries go to the kernel; every other call (other models in the process, prefill, bfloat16,
quantized caches, attention sinks) goes to mlx-lm's function unchanged. So the kernel path is
scoped to the models whose fingerprint already names the kernels.
"""

from __future__ import annotations

import contextvars
import sys

import mlx.core as mx

from .swap import subclass_with_call

__all__ = ["attention", "use_native_attention"]

_MARKED = contextvars.ContextVar("forkv_native_attention", default=None)
_NAME = "scaled_dot_product_attention"
_subclasses: dict[type, type] = {}


def _mlx_lm_sdpa():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


def attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx-lm's scaled_dot_product_attention, on the kernel where the call is marked."""
    lib = _MARKED.get()
    if (lib is not None and sinks is None and not hasattr(cache, "bits")
            and queries.ndim == 4 and queries.shape[2] == 1 and keys.shape == values.shape
            and queries.shape[-1] == keys.shape[-1] and queries.shape[-1] % 16 == 0
            and queries.shape[1] % keys.shape[1] == 0
            and queries.dtype == keys.dtype == values.dtype == mx.float32
            and (mask is None or isinstance(mask, (str, mx.array)))):
        # One query row: a "causal" mask keeps every key.
        return lib.decode_attention(queries, keys, values, scale,
                                    None if isinstance(mask, str) else mask)
    return _mlx_lm_sdpa()(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _marked_class(cls: type) -> type:
    def __call__(self, *args, **kwargs):
        token = _MARKED.set(self._forkv_lib)
        try:
            return cls.__call__(self, *args, **kwargs)
        finally:
            _MARKED.reset(token)

    return subclass_with_call(cls, __call__, _subclasses)


def _calls_sdpa(cls: type) -> bool:
    call = getattr(cls, "__call__", None)
    code = getattr(call, "__code__", None)
    module = sys.modules.get(cls.__module__)
    return (code is not None and _NAME in code.co_names and module is not None
            and getattr(module, _NAME, None) in (_mlx_lm_sdpa(), attention))


def use_native_attention(model, lib) -> int:
    """Route `model`'s decode attention to the kernel; returns how many modules it marked."""
    count = 0
    for _, m in model.named_modules():
        cls = type(m)
        if cls in _subclasses.values():
            count += 1
            continue
        if not _calls_sdpa(cls):
            continue
        setattr(sys.modules[cls.__module__], _NAME, attention)
        m.__class__ = _marked_class(cls)
        m._forkv_lib = lib
        count += 1
    return count
