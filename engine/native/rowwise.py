"""RMS norms and rotary embeddings on forkv's kernels, for the models already on them.

mlx's CPU backend runs `mx.fast.rms_norm` and `mx.fast.rope` as chains of small ops, and at
decode their dispatch costs more than their arithmetic (Gemma 3 270M: ~13 ms of norms and
~11 ms of ropes in a 60 ms step). `use_native_rowwise(model, lib)` gives the model's norm and
rope modules a subclass that computes each in one kernel call: `nn.RMSNorm`, the Gemma
family's `RMSNorm` (weight + 1), and `nn.RoPE`. Calls they cannot take (not float32) go to
the original module code. Other models in the process are untouched.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .swap import subclass_with_call

__all__ = ["use_native_rowwise"]

# Norm classes whose __call__ is `mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)`
# (tests/test_native.py checks each against its original).
GEMMA_NORMS = ("mlx_lm.models.gemma.RMSNorm", "mlx_lm.models.gemma2.RMSNorm",
               "mlx_lm.models.gemma3_text.RMSNorm", "mlx_lm.models.recurrent_gemma.RMSNorm")

_subclasses: dict[type, type] = {}


def _norm_class(cls: type, offset: float) -> type:
    def __call__(self, x):
        w = self["weight"]
        if x.dtype == mx.float32 and w.dtype == mx.float32:
            return self._forkv_lib.rms_norm(x, w, self.eps, offset)
        return cls.__call__(self, x)

    return subclass_with_call(cls, __call__, _subclasses)


def _rope_class(cls: type) -> type:
    def __call__(self, x, offset=0):
        if x.dtype != mx.float32 or x.ndim < 2:
            return cls.__call__(self, x, offset)
        if isinstance(offset, mx.array):
            return self._forkv_lib.rope(x, self.dims, self.traditional, self.base, self.scale,
                                        0, offset)
        return self._forkv_lib.rope(x, self.dims, self.traditional, self.base, self.scale,
                                    int(offset))

    return subclass_with_call(cls, __call__, _subclasses)


def _native_class(cls: type) -> type | None:
    if cls is nn.RMSNorm:
        return _norm_class(cls, 0.0)
    if f"{cls.__module__}.{cls.__qualname__}" in GEMMA_NORMS:
        return _norm_class(cls, 1.0)
    if cls is nn.RoPE:
        return _rope_class(cls)
    return None


def use_native_rowwise(model, lib) -> tuple[int, int]:
    """Move `model`'s norms and ropes onto the kernels; returns (norms, ropes)."""
    norms = ropes = 0
    for _, m in model.named_modules():
        cls = type(m)
        sub = cls if cls in _subclasses.values() else _native_class(cls)
        if sub is None:
            continue
        m.__class__ = sub
        m._forkv_lib = lib
        if issubclass(sub, nn.RoPE):
            ropes += 1
        else:
            norms += 1
    return norms, ropes
