"""Evaluate every array a model object holds, on the thread that made them.

mlx streams are per thread: an array built lazily on one thread (a model loaded by the caller,
a rope's private frequency table) cannot be evaluated on another. Before an engine thread takes
over a model loaded elsewhere, the loading thread evaluates everything the model holds —
parameters and private attributes alike. Knows nothing about engines.
"""

from __future__ import annotations


def materialize(model) -> int:
    """mx.eval every array reachable from `model` (modules, dicts, lists, attributes); how
    many arrays there were."""
    import mlx.core as mx

    found: list = []
    seen: set[int] = set()
    todo = [model]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mx.array):
            found.append(obj)
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        if hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo.extend(vars(obj).values())
    mx.eval(found)
    return len(found)
