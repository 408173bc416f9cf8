"""Module subclasses that replace one `__call__`: how the kernels move onto a model's modules
in place (`module.__class__ = sub`), per model, without touching mlx-lm's code."""

from __future__ import annotations

__all__ = ["subclass_with_call"]


def subclass_with_call(cls: type, call, cache: dict[type, type]) -> type:
    """`cls` with `__call__` replaced, made once per class and kept in `cache`."""
    sub = cache.get(cls)
    if sub is None:
        # Same name and module: code that reports or matches class names sees the original.
        sub = type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        cache[cls] = sub
    return sub
