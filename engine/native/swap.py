"""Module subclasses that replace one `__call__`: how the kernels move onto a model's modules
in place (`module.__class__ = sub`), per model, without touching mlx-lm's code.

`marked_subclass` is the shape attention and the activations share: the class's own
`__call__` code, with some global names bound to forkv's dispatchers in a copy of its globals
(the model's module itself is left alone: its other functions, some under `mx.compile`, keep
mlx's ops, since a compiled function would freeze whichever choice its first trace made), run
with a context variable set to the instance's kernels, which the dispatchers read.
"""

from __future__ import annotations

import contextvars
import types

__all__ = ["marked_subclass", "subclass_with_call"]


def subclass_with_call(cls: type, call, cache: dict[type, type]) -> type:
    """`cls` with `__call__` replaced, made once per class and kept in `cache`."""
    sub = cache.get(cls)
    if sub is None:
        # Same name and module: code that reports or matches class names sees the original.
        sub = type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        cache[cls] = sub
    return sub


def marked_subclass(cls: type, bind: dict, marker: contextvars.ContextVar,
                    cache: dict[type, type]) -> type:
    """`cls` whose `__call__` runs its own code with the globals in `bind` replaced, while
    `marker` holds the instance's `_forkv_lib`; made once per class and kept in `cache`."""
    if cls in cache:
        return cache[cls]
    func = cls.__call__
    scope = {**func.__globals__, **bind}
    own = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__,
                             func.__closure__)
    own.__kwdefaults__ = func.__kwdefaults__

    def __call__(self, *args, **kwargs):
        token = marker.set(self._forkv_lib)
        try:
            return own(self, *args, **kwargs)
        finally:
            marker.reset(token)

    return subclass_with_call(cls, __call__, cache)
