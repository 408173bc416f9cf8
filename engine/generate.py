"""The token generator at the core: block-aligned chunked prefill, then decode.

Prefill runs in chunks that end exactly on block boundaries (multiples of `block_size`), so a
checkpoint hook sees the model state at every boundary, in prefill and in decode alike, and a
run that starts from a restored boundary computes exactly what a fresh run computes from there.
Knows nothing about text, keys or stores: the hook decides what to record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .sampling import Sampler

# Called with (position, tokens[:position], cache, in_decode) whenever the cache holds exactly
# `position` tokens and position is a multiple of the block size. The hook may replace items
# of `cache` (the list is the live one).
BoundaryHook = Callable[[int, Sequence[int], list, bool], None]


@dataclass(slots=True)
class Step:
    token: int
    logprob: float
    position: int  # tokens in the cache before this token is fed back


def chunk_ends(start: int, end: int, block_size: int) -> list[int]:
    """Ends of the prefill chunks covering [start, end): every block boundary, then `end`."""
    ends = list(range((start // block_size + 1) * block_size, end, block_size))
    if not ends or ends[-1] != end:
        ends.append(end)
    return ends


def prefill(model, cache: list, tokens: Sequence[int], start: int, block_size: int,
            on_boundary: BoundaryHook | None = None):
    """Feed tokens[start:] into `cache` (which holds tokens[:start]); return last-token logits."""
    import mlx.core as mx

    assert start < len(tokens), "prefill needs at least one new token"
    pos, logits = start, None
    for end in chunk_ends(start, len(tokens), block_size):
        logits = model(mx.array(tokens[pos:end])[None], cache=cache)
        pos = end
        if end == len(tokens):
            break
        # Only the cache is needed from inner chunks; the unused logits stay unevaluated.
        mx.eval([c.state for c in cache])
        if on_boundary is not None and end % block_size == 0:
            on_boundary(end, tokens[:end], cache, False)
    last = logits[0, -1]
    mx.eval(last, [c.state for c in cache])
    if on_boundary is not None and pos % block_size == 0:
        on_boundary(pos, tokens[:pos], cache, False)
    return last


def generate_steps(model, cache: list, tokens: Sequence[int], start: int, sampler: Sampler,
                   max_tokens: int, block_size: int, eos_ids: frozenset[int] = frozenset(),
                   on_boundary: BoundaryHook | None = None,
                   timings: dict | None = None) -> Iterator[Step]:
    """Prefill tokens[start:] then decode up to `max_tokens` tokens, stopping after an EOS."""
    import mlx.core as mx

    timings = timings if timings is not None else {}
    t0 = time.perf_counter()
    seq = list(tokens)
    logits = prefill(model, cache, seq, start, block_size, on_boundary)
    timings["prefill_s"] = time.perf_counter() - t0
    if max_tokens == 0:
        return
    token, logprobs = sampler(logits)
    for n in range(max_tokens):
        tok = int(token.item())
        step = Step(tok, float(logprobs[tok].item()), len(seq))
        if n == 0:
            timings["first_token_s"] = time.perf_counter() - t0
        seq.append(tok)
        last = n + 1 == max_tokens or tok in eos_ids
        if not last:
            # Start the next forward pass before handing this token out (overlaps decode
            # with the consumer's work, as mlx-lm does).
            out = model(mx.array([[tok]]), cache=cache)
            token, logprobs = sampler(out[0, -1])
            mx.async_eval(token, logprobs)
        yield step
        if last:
            break
        if on_boundary is not None and len(seq) % block_size == 0:
            mx.eval([c.state for c in cache])
            on_boundary(len(seq), seq, cache, True)
    timings["decode_s"] = time.perf_counter() - t0 - timings["prefill_s"]
