"""Block-aligned chunked prefill: the chunk schedule every run and every exactness check uses.

Prefill runs in chunks that end exactly on block boundaries (multiples of `block_size`), so a
checkpoint hook sees the model state at every boundary, and a run that starts from a restored
boundary computes exactly what a fresh run computes from there (the engine's sequences prefill
with the same `chunk_ends`). Text runs also cut inside a chunk at turn ends, vision runs at
image ends: their model callables (turns.TurnModel, vision.VisionSequence) split each chunk
with the one splitter here, `run_pieces`. Knows nothing about text, keys or stores: the hook
decides what to record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from .lasthead import last_position_only


# Called with (position, tokens[:position], cache, in_decode) whenever the cache holds exactly
# `position` tokens and position is a multiple of the block size. The hook may replace items
# of `cache` (the list is the live one).
BoundaryHook = Callable[[int, Sequence[int], list, bool], None]


def chunk_ends(start: int, end: int, block_size: int) -> list[int]:
    """Ends of the prefill chunks covering [start, end): every block boundary, then `end`."""
    ends = list(range((start // block_size + 1) * block_size, end, block_size))
    if not ends or ends[-1] != end:
        ends.append(end)
    return ends


def run_pieces(inputs, cache: list, ends: Sequence[int], forward, on_end=None,
               at_last: bool = True):
    """Feed a chunk (`inputs`, after what `cache` holds) in pieces that end at each of `ends`
    inside it, so every run of the same input cuts there and a checkpoint there is exact:
    `forward(ids, cache, a, b)` runs tokens [a, b) and gives their logits; `on_end(b, cache,
    logits)` runs at each end reached (the chunk's own end too, if `at_last`). The last
    piece's logits."""
    # The first cache that counts tokens (a gated-delta layer's state does not).
    first = next(c.offset for c in cache if hasattr(c, "offset"))
    last = first + inputs.shape[1]
    inside = [e for e in ends if first < e < last]
    stops = set(inside) | ({last} & set(ends) if at_last else set())
    logits, a = None, first
    for b in inside + [last]:
        logits = forward(inputs[:, a - first:b - first], cache, a, b)
        if on_end is not None and b in stops:
            on_end(b, cache, logits)
        a = b
    return logits


def run_chunk(model, cache: list, tokens: Sequence[int], start: int, end: int):
    """Feed tokens[start:end] into `cache`, evaluated; the last-token logits when `end` is the
    end of `tokens` (whose chunk runs the head on its last position only: lasthead.py), else
    None (the unused logits of inner chunks stay unevaluated). The one chunk step of every
    prefill: the engine's sequences and `prefill` below."""
    import mlx.core as mx

    is_last = end == len(tokens)
    with last_position_only(model) if is_last else contextlib.nullcontext():
        logits = model(mx.array(tokens[start:end])[None], cache=cache)
    if not is_last:
        mx.eval([c.state for c in cache])
        return None
    last = logits[0, -1]
    mx.eval(last, [c.state for c in cache])
    return last


def prefill(model, cache: list, tokens: Sequence[int], start: int, block_size: int,
            on_boundary: BoundaryHook | None = None):
    """Feed tokens[start:] into `cache` (which holds tokens[:start]); return last-token logits."""
    assert start < len(tokens), "prefill needs at least one new token"
    pos, last = start, None
    for end in chunk_ends(start, len(tokens), block_size):
        last = run_chunk(model, cache, tokens, pos, end)
        pos = end
        if on_boundary is not None and end % block_size == 0:
            on_boundary(end, tokens[:end], cache, False)
    return last
