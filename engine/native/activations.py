"""The MLP's activations on forkv's kernels, for the models whose matmuls already run on them.

mlx's CPU backend evaluates tanh and exp one element at a time: Gemma 3 270M's gelu over one
256-token prefill chunk (256 x 2048) takes ~16 ms there and 0.3 ms on the kernel, and 18 of
them ran longer than the chunk's matmuls. mlx-lm's MLPs call `nn.gelu_approx` / `nn.silu`
(attributes of the `nn` their module imported) or `swiglu` (a name imported from
mlx_lm.models.activations). `use_native_activations(model, lib)` gives the model's modules
whose `__call__` reads those names a same-named subclass whose `__call__` is the original's
code with those names bound to the functions below (`nn` to a stand-in that forwards every
other attribute to mlx.nn), and which marks its calls. Only marked float32 calls go to the
kernel; any other caller (other models in the process, bfloat16) gets mlx's function
unchanged. The model's module itself is left alone: its own functions, some of them under
`mx.compile` (Gemma 4's `geglu`), keep mlx's activations, since a compiled function would
freeze whichever choice its first trace made.
"""

from __future__ import annotations

import contextvars
import types

import mlx.core as mx
import mlx.nn as nn

from .swap import marked_subclass

__all__ = ["gelu_approx", "silu", "swiglu", "use_native_activations"]

_MARKED = contextvars.ContextVar("forkv_native_activation", default=None)
_subclasses: dict[type, type] = {}
_ACTIVATIONS = ("gelu_approx", "silu")


def _mlx_lm_swiglu():
    from mlx_lm.models import activations

    return activations.swiglu


def gelu_approx(x):
    lib = _MARKED.get()
    if lib is not None and x.dtype == mx.float32:
        return lib.activation(x, "gelu_approx")
    return nn.gelu_approx(x)


def silu(x):
    lib = _MARKED.get()
    if lib is not None and x.dtype == mx.float32:
        return lib.activation(x, "silu")
    return nn.silu(x)


def swiglu(gate, x):
    """mlx-lm's `swiglu(gate, x)` = silu(gate) * x, in one kernel call where marked."""
    lib = _MARKED.get()
    if (lib is not None and gate.dtype == x.dtype == mx.float32 and gate.shape == x.shape):
        return lib.activation(gate, "silu", x)
    return _mlx_lm_swiglu()(gate, x)


class _NN(types.ModuleType):
    """mlx.nn with gelu_approx and silu pointing at the dispatchers above."""

    gelu_approx = staticmethod(gelu_approx)
    silu = staticmethod(silu)

    def __getattr__(self, name):
        return getattr(nn, name)


_nn = _NN("mlx.nn")


def _names(cls: type) -> tuple[str, ...]:
    """Which global names `cls.__call__` reads that this module can take over."""
    call = getattr(cls, "__call__", None)
    code = getattr(call, "__code__", None)
    if code is None or not cls.__module__.startswith("mlx_lm."):
        return ()
    names, scope = set(code.co_names), call.__globals__
    out = []
    if "nn" in names and names & set(_ACTIVATIONS) and scope.get("nn") is nn:
        out.append("nn")
    if "swiglu" in names and scope.get("swiglu") is _mlx_lm_swiglu():
        out.append("swiglu")
    return tuple(out)


def use_native_activations(model, lib) -> int:
    """Route `model`'s MLP activations to the kernel; returns how many modules it marked."""
    count = 0
    for _, m in model.named_modules():
        cls = type(m)
        if cls in _subclasses.values():
            count += 1
            continue
        names = _names(cls)
        if not names:
            continue
        bind = {n: _nn if n == "nn" else swiglu for n in names}
        m.__class__ = marked_subclass(cls, bind, _MARKED, _subclasses)
        m._forkv_lib = lib
        count += 1
    return count
