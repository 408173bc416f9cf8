"""Exact speculative decoding: verify a row's draft in one chunk, keep what the model agrees with.

A decoding row with a draft (drafts.py) feeds its last token and the k draft tokens as one
chunk. Position i's logits are the bits one-token decode would give there — forkv's kernels
compute each row on its own, whatever the chunk (float `Linear` layers, which BLAS multiplies
with other kernels for more rows, run row by row inside `rowwise()`) — so the sampler draws
at each position exactly what decode would, with the key of that draw (sampling.py), and a
draft token is kept only while the draw equals it. The first draw that differs is kept too,
as decode would have drawn it: every verify step yields at least one token.

Rejected positions leave no trace: global K/V caches trim, sliding-window rings trim and drop
the chunk's tail (mlx-lm's ring then rotates from there as after a prefill chunk), and a cache
that cannot trim (recurrent state) is put back as it was before the chunk and the accepted
tokens are fed again. Whether a model's chunks really give decode's bits is probed once per
model (`is_exact`): where they do not (mlx's own kernels, some float attention shapes),
speculation stays off, so it never changes a token. Knows nothing about drafts' sources,
stop rules or records: the scheduler runs the accepted tokens through them.
"""

from __future__ import annotations

import contextlib
import contextvars

import mlx.core as mx
import mlx.nn as nn

from .cacheshape import leaves, rotates, trims

__all__ = ["blocker", "exactness", "rollback", "rowwise", "snapshot"]

# Float matmul weights above this run row by row in a verify, reading them once per row: there
# the chunk costs about as much as decoding each of its tokens, and auto mode does not draft.
_ROWWISE_AUTO_BYTES = 16 << 20

_ROWWISE = contextvars.ContextVar("forkv_rowwise", default=False)


def _by_rows(matmul, x):
    """`matmul(x)`, one row of a chunk at a time inside `rowwise()`."""
    if _ROWWISE.get() and x.ndim >= 2 and x.shape[-2] > 1:
        return mx.concatenate([matmul(x[..., i:i + 1, :]) for i in range(x.shape[-2])],
                              axis=-2)
    return matmul(x)


class RowwiseLinear(nn.Linear):
    """An `nn.Linear` that multiplies a chunk row by row inside `rowwise()`: BLAS picks other
    kernels (other sums) for more rows, and a verified position must get one row's bits."""

    def __call__(self, x):
        return _by_rows(super().__call__, x)


class RowwiseEmbedding(nn.Embedding):
    """An `nn.Embedding` whose `as_linear` (a tied output head) runs row by row inside
    `rowwise()`, as RowwiseLinear."""

    def as_linear(self, x):
        return _by_rows(super().as_linear, x)


@contextlib.contextmanager
def rowwise():
    token = _ROWWISE.set(True)
    try:
        yield
    finally:
        _ROWWISE.reset(token)


def _use_rowwise(model) -> None:
    for _, m in model.named_modules():
        if type(m) is nn.Linear:
            m.__class__ = RowwiseLinear
        elif type(m) is nn.Embedding:
            m.__class__ = RowwiseEmbedding


def blocker(lm, mode: str) -> str | None:
    """None when requests on `lm` speculate in `mode` ("auto", "on", "off"), else why not."""
    if mode == "off":
        return "speculation is off"
    why = exactness(lm)
    if why is None and mode == "auto":
        rowwise_bytes = sum(m.weight.nbytes for _, m in lm.model.named_modules()
                            if isinstance(m, (RowwiseLinear, RowwiseEmbedding)))
        if rowwise_bytes > _ROWWISE_AUTO_BYTES:
            why = (f"{rowwise_bytes >> 20} MiB of float matmul weights would be read once per "
                   "verified token, so verifying costs what decoding does (speculate='on' "
                   "verifies anyway)")
    return why


def exactness(lm) -> str | None:
    """None when a verify chunk gives one-token decode's bits on `lm` (probed once), else why
    speculation stays off on it."""
    if lm.chunk_exactness is None:
        lm.chunk_exactness = _probe(lm) or ""
    return lm.chunk_exactness or None


def _probe(lm) -> str | None:
    if getattr(lm, "kernels", None) is None or mx.default_device() != mx.cpu:
        return ("its matmuls run on mlx's kernels, whose sums depend on how many rows share a "
                "call")
    _use_rowwise(lm.model)
    # a vision model's text decoding (images change positions, not how a chunk sums)
    text_model = lm.model.language_model if getattr(lm, "is_vision", False) else lm.model

    def forward(ids, cache):
        out = text_model(mx.array(ids)[None], cache=cache)
        return getattr(out, "logits", out)

    vocab = int(lm.config.get("vocab_size") or 256)
    ids = [(i * 7919 + 11) % max(vocab - 1, 2) + 1 for i in range(20)]

    def run(steps, back: int = 0):
        cache = lm.make_cache()
        if mergeable and getattr(lm, "is_vision", False):  # a lone text row decodes unmerged
            cache = [type(c).merge([c]) for c in cache]
        out, pos = [], 0
        for i, n in enumerate(steps):
            saved = snapshot(cache)
            with rowwise() if i else contextlib.nullcontext():
                logits = forward(ids[pos:pos + n], cache)
            keep = n - back if i == 1 else n  # the first chunk after the prompt: a rejection
            mx.eval(logits, [c.state for c in cache])
            if keep < n and not rollback(cache, n - keep, n, saved):
                with rowwise():
                    forward(ids[pos:pos + keep], cache)
                mx.eval([c.state for c in cache])
            out.append(logits[0, :keep])
            pos += keep
        return mx.concatenate(out, axis=0)[12:]

    from .batchcache import merge_blocker

    mergeable = merge_blocker(lm.make_cache()) is None
    try:
        one = run([12] + [1] * 8)
        chunk = run([12, 5, 5], back=2)
    except Exception as e:  # noqa: BLE001 - a model that cannot take a chunk cannot verify
        return f"a verify chunk failed on it ({type(e).__name__}: {e})"
    if not mx.array_equal(one, chunk).item():
        return "its chunks do not give one-token decode's bits (a verify could change tokens)"
    return None


def _copy(v):
    """A copy of a small array (offsets, paddings: mlx-lm updates those in place); a cache's
    K/V or state arrays are kept by reference (a chunk replaces them)."""
    return mx.array(v) if isinstance(v, mx.array) and v.ndim <= 1 else v


def snapshot(caches) -> list | None:
    """What `rollback` needs to put back caches that cannot trim (None when all can): their
    state as it is before a verify chunk. A chunk replaces these caches' arrays instead of
    writing into them, so the references stay valid; small attributes that mlx-lm updates in
    place (`-=`) are copied."""
    layers = list(leaves(caches))
    if all(trims(c) or rotates(c) for c in layers):
        return None
    saved = []
    for c in layers:
        if trims(c):
            saved.append(None)
        elif hasattr(c, "cache") and isinstance(c.cache, list):  # ArraysCache and kin
            saved.append(("arrays", list(c.cache), {k: _copy(v) for k, v in vars(c).items()
                                                     if k != "cache"}))
        else:
            saved.append(("attrs", {k: _copy(v) for k, v in vars(c).items()}))
    return saved


def rollback(caches, n: int, fed: int, saved: list | None) -> bool:
    """Take the last `n` of the `fed` tokens of a verify chunk back out of `caches`; True when
    done, False when the caches were put back as before the chunk (`saved`) and the kept
    `fed - n` tokens must be fed again."""
    if n == 0:
        return True
    layers = list(leaves(caches))
    if saved is None:
        for c in layers:
            c.trim(n)
            if rotates(c):
                _drop_tail(c)
        return True
    for c, s in zip(layers, saved):
        if s is None:
            c.trim(fed)
        elif s[0] == "arrays":
            c.cache[:] = s[1]
            for k, v in s[2].items():
                setattr(c, k, v)
        else:
            for k, v in s[1].items():
                setattr(c, k, v)
    return False


def _drop_tail(c) -> None:
    """After a trim, end a ring's arrays where its tokens end: a chunk left them in time order
    with the rejected positions after `_idx`, and the next one-token update must find the
    newest token last (it then trims the oldest and rotates, as after a prefill chunk)."""
    if c.keys is not None and c.keys.shape[2] > c._idx:
        c.keys = c.keys[..., :c._idx, :]
        c.values = c.values[..., :c._idx, :]
