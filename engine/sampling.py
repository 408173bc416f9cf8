"""Sampling settings and a seeded sampler (temperature, top-k, top-p) over a logits vector.

Each request owns its random key, so a seed reproduces its tokens whatever else runs beside it.
Knows nothing about models or caches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import GenerationError


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if self.max_tokens < 0:
            raise GenerationError(f"max_tokens must be >= 0, got {self.max_tokens}.")
        if self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0 (0 = off), got {self.top_k}.")
        if any(not s for s in self.stop):
            raise GenerationError("stop strings must be non-empty.")


class Sampler:
    """Draws one token per call from `logits` (shape [vocab]); returns (token, logprobs)."""

    def __init__(self, params: SamplingParams, vocab_limit: int | None = None,
                 prompt_len: int = 0):
        import mlx.core as mx

        self.params = params
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        self._key = mx.random.key(seed)
        # Padded vocabularies have ids the tokenizer cannot decode; never sample them.
        self._vocab_limit = vocab_limit
        self.prompt_len = prompt_len  # tokens[prompt_len:] are the generated ones

    def __call__(self, logits, tokens: Sequence[int] = ()):
        """`tokens`: the sequence so far (prompt, then generated tokens), for penalties and
        constraints."""
        import mlx.core as mx

        logits = logits.astype(mx.float32)
        if self._vocab_limit is not None and logits.shape[-1] > self._vocab_limit:
            mask = mx.arange(logits.shape[-1]) < self._vocab_limit
            logits = mx.where(mask, logits, -mx.inf)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        p = self.params
        if p.temperature == 0:
            return mx.argmax(logprobs, axis=-1), logprobs
        scores = logprobs / p.temperature
        if p.top_k and p.top_k < scores.shape[-1]:
            kth = mx.sort(scores, axis=-1)[..., -p.top_k]
            scores = mx.where(scores >= kth[..., None], scores, -mx.inf)
        if p.top_p < 1.0:
            order = mx.argsort(-scores, axis=-1)
            sorted_scores = mx.take_along_axis(scores, order, axis=-1)
            probs = mx.softmax(sorted_scores, axis=-1)
            # Keep the smallest head whose mass reaches top_p (always at least one token).
            keep_sorted = (mx.cumsum(probs, axis=-1) - probs) < p.top_p
            keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
            scores = mx.where(keep, scores, -mx.inf)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(scores, key=sub), logprobs
