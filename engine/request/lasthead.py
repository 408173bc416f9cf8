"""Prefill's last chunk needs the logits of its last position only.

mlx-lm's text models compute `head(self.model(inputs))` for every position of a chunk; on a
262K-vocabulary model (Gemma 3) the head of a 256-token chunk is a [256 x 640] x [640 x 262144]
matmul — as much work as the rest of the 270M model, and with no BLAS path in bfloat16.
`last_position_only(model)` makes the model's inner stack return its last position only, so the
head runs on one row, as mlx-lm's own generate does (it feeds the prompt's last token alone).
The caches are untouched: every position still goes through every layer. The exactness
reference (`generate.prefill`) and the engine's prefill both use it, so they stay bit-equal.

Knows: the shape every mlx-lm text model shares (`Model.__call__` applies its head to
`self.model(...)`, directly or through `language_model`). Leaves other models (mlx-vlm's) alone.
"""

from __future__ import annotations

import contextlib


class _LastPosition:
    """Stands in for a model's inner stack: the same call, only the last position kept."""

    __slots__ = ("_inner",)

    def __init__(self, inner):
        self._inner = inner

    def __call__(self, *args, **kwargs):
        hidden = self._inner(*args, **kwargs)
        return hidden[:, -1:] if getattr(hidden, "ndim", 0) == 3 else hidden

    def __getattr__(self, name):  # embed_tokens (tied heads), args, ...
        return getattr(self._inner, name)


def _head_owner(model):
    """The mlx-lm module whose `__call__` applies the head to `self.model(...)`, or None."""
    while not type(model).__module__.startswith(("mlx_lm.", "mlx.")) and hasattr(model, "model"):
        model = model.model  # TurnModel and other callables that wrap the model
    if not type(model).__module__.startswith("mlx_lm.models."):
        return None
    inner = model.get("language_model") if isinstance(model, dict) else None
    owner = inner if inner is not None else model
    return owner if isinstance(owner, dict) and "model" in owner else None


@contextlib.contextmanager
def last_position_only(model):
    """Within the block, `model(inputs, cache=...)` returns logits of the last position only
    (shape [B, 1, V]) where the model allows it; elsewhere it is a plain call."""
    owner = _head_owner(model)
    if owner is None or "model" in owner.__dict__:
        yield
        return
    # Shadow the child in the instance dict (mlx's Module.__setattr__ would drop it from the
    # parameters); only the engine thread calls the model, so nothing else sees the stand-in.
    object.__setattr__(owner, "model", _LastPosition(owner["model"]))
    try:
        yield
    finally:
        del owner.__dict__["model"]
