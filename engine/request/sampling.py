"""Sampling settings and a seeded sampler over one row's logits.

Settings: temperature, top-k, top-p, min-p, repetition / presence / frequency penalties,
logit bias, stop strings, and how many top logprobs to report. Penalties and the logit bias
are mlx-lm's logits processors and top-k / top-p / min-p its filters (`mlx_lm.sample_utils`);
the draw itself uses the request's own random key, so a seed reproduces its tokens whatever
else runs beside it. Knows nothing about models or caches.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import GenerationError
from .constrain import RowMatcher, as_constraint

__all__ = ["Sampler", "SamplingParams", "draw_rows", "top_logprobs", "vocab_limit"]

# (field, type, lowest allowed, lowest is allowed, highest, why) for numeric settings.
_RANGES = (
    ("max_tokens", int, 0, True, None, ""),
    ("temperature", float, 0.0, True, None, "0 = greedy"),
    ("top_p", float, 0.0, False, 1.0, "1 = off"),
    ("top_k", int, 0, True, None, "0 = off"),
    ("min_p", float, 0.0, True, 1.0, "0 = off"),
    ("repetition_penalty", float, 0.0, False, None, "1 = off"),
    ("presence_penalty", float, None, True, None, "0 = off"),
    ("frequency_penalty", float, None, True, None, "0 = off"),
    ("penalty_context", int, 1, True, None, "tokens the penalties look back over"),
    ("top_logprobs", int, 0, True, 20, "0 = off"),
)


@dataclass(slots=True)
class SamplingParams:
    """How to draw tokens. Penalties look at the last `penalty_context` tokens of the whole
    sequence (prompt included), as mlx-lm's do; `logit_bias` maps token id -> added logit;
    `top_logprobs` > 0 asks for that many most likely tokens with each generated one."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_context: int = 20
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int = 0
    constraint: Any = None  # what the output must match: see forkv.engine.request.constrain

    def __post_init__(self) -> None:
        self.constraint = as_constraint(self.constraint)
        for name, kind, low, low_ok, high, why in _RANGES:
            setattr(self, name, _number(name, getattr(self, name), kind, low, low_ok, high, why))
        if self.seed is not None and (isinstance(self.seed, bool) or
                                      not isinstance(self.seed, int)):
            raise GenerationError(f"seed must be an integer or None, got {self.seed!r}.")
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 64:
            raise GenerationError(f"seed must fit in 64 bits (-2**63 to 2**64 - 1), got "
                                  f"{self.seed}.")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise GenerationError("stop must be a non-empty string or a list of them, "
                                  f"got {self.stop!r}.")
        self.stop = tuple(self.stop)
        self.logit_bias = _bias(self.logit_bias)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def _number(name: str, value, kind: type, low, low_ok: bool, high, why: str):
    """`value` as `kind`, or a GenerationError naming the field and its allowed range."""
    rng = (f"{'>=' if low_ok else '>'} {low}" if low is not None else "") + (
        f"{' and ' if low is not None else ''}<= {high}" if high is not None else "")
    hint = f" ({why})" if why else ""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and not math.isfinite(value):
        ok = False
    if ok and kind is int and value != int(value):
        ok = False
    if ok and low is not None and (value < low or (value == low and not low_ok)):
        ok = False
    if ok and high is not None and value > high:
        ok = False
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise GenerationError(f"{name} must be {what}{' ' + rng if rng else ''}{hint}, "
                              f"got {value!r}.")
    return kind(value)


def _bias(bias) -> dict[int, float]:
    if not isinstance(bias, Mapping):
        raise GenerationError(f"logit_bias must map token ids to numbers, got {bias!r}.")
    out = {}
    for k, v in bias.items():
        try:  # JSON objects have string keys: "42" is token 42
            tid = int(k)
        except (TypeError, ValueError):
            tid = -1
        if tid < 0 or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GenerationError(f"logit_bias entry {k!r}: {v!r} is not a token id (>= 0) "
                                  "mapped to a number; fix that entry.")
        out[tid] = float(v)
    return out


_VOCAB_LIMITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocab_limit(lm) -> int | None:
    """How many ids `lm`'s tokenizer can decode (padded model vocabularies have more rows);
    once per tokenizer: `len(tokenizer.vocab)` builds a 262K-entry dict (~250 ms)."""
    tok = getattr(lm, "tokenizer", None)
    if tok is None:
        return None
    try:
        return _VOCAB_LIMITS[tok]
    except (KeyError, TypeError):
        pass
    try:
        size = len(tok)  # the backend's count, added tokens included
    except TypeError:  # (not hasattr(tok, "vocab"): that alone builds the whole dict)
        vocab = getattr(tok, "vocab", None)
        size = len(vocab) if vocab is not None else None
    try:
        _VOCAB_LIMITS[tok] = size
    except TypeError:
        pass
    return size


def top_logprobs(logprobs, k: int) -> dict[int, float]:
    """The `k` most likely token ids of a [vocab] logprobs row, with their logprobs."""
    import mlx.core as mx

    if k <= 0:
        return {}
    k = min(k, logprobs.shape[-1])
    ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:k]
    values = logprobs[ids]
    order = mx.argsort(-values)
    return dict(zip(ids[order].tolist(), values[order].tolist()))


class Sampler:
    """Draws one token per call from `logits` (shape [vocab]); returns (token, logprobs).

    `logprobs` are those of the processed distribution (logit bias and penalties applied,
    before temperature and filters), as mlx-lm reports them.
    """

    def __init__(self, params: SamplingParams, vocab_limit: int | None = None,
                 prompt_len: int = 0, tokenizer: Any = None, kernels: Any = None,
                 never: Sequence[int] = ()):
        import mlx.core as mx
        from mlx_lm.sample_utils import make_logits_processors

        self.params = params
        # forkv's kernels (engine/native) for a model that runs on them, on the CPU
        self._kernels = kernels if kernels is not None and mx.default_device() == mx.cpu else None
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        self._key = mx.random.key(seed % (1 << 64))  # a negative seed as its 64 bits
        # (next key, this draw's key) for the draws ahead of the last one taken: the key of
        # the i-th draw is a function of the seed and i alone, so a verified draft position
        # draws what one-token decode would (speculation changes no seeded token)
        self._ahead: list = []
        # Padded vocabularies have ids the tokenizer cannot decode; never sample them.
        self._vocab_limit = vocab_limit
        # Ids no answer may hold: a vision model's image placeholder, which would turn the
        # answer's text into a slot for an image when the conversation is rendered again.
        self._never = mx.array(sorted(never), dtype=mx.int32) if never else None
        self.prompt_len = prompt_len  # tokens[prompt_len:] are the generated ones
        self._matcher = _row_matcher(params.constraint, tokenizer)
        p = params
        if vocab_limit is not None and p.logit_bias and max(p.logit_bias) >= vocab_limit:
            raise GenerationError(f"logit_bias names token {max(p.logit_bias)}, but the "
                                  f"vocabulary has {vocab_limit} tokens; drop that entry.")
        # A bias and nothing else of the processors: the native draw adds it itself.
        self._bias_only = bool(p.logit_bias) and (p.repetition_penalty == 1.0
                                                 and not p.presence_penalty
                                                 and not p.frequency_penalty)
        self._bias = (mx.array(list(p.logit_bias), dtype=mx.int32),
                      mx.array(list(p.logit_bias.values()), dtype=mx.float32)) \
            if p.logit_bias else None
        self._processors = make_logits_processors(
            p.logit_bias or None,
            p.repetition_penalty if p.repetition_penalty != 1.0 else None, p.penalty_context,
            p.presence_penalty or None, p.penalty_context,
            p.frequency_penalty or None, p.penalty_context)

    @property
    def reads_tokens(self) -> bool:
        """Whether a draw reads the values of the tokens before it (penalties, a constraint);
        one that does not can be built before the last token is read back (ahead.py)."""
        p = self.params
        return (self._matcher is not None or p.repetition_penalty != 1.0
                or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0)

    @property
    def can_verify(self) -> bool:
        """Whether a row's draw at a position ahead is a pure function of the tokens before it
        (a constraint's matcher keeps state as it walks the output)."""
        return self._matcher is None

    @property
    def fused(self) -> bool:
        """Whether a draw runs as forkv's one native call (`draw_rows`): the kernels are loaded
        and no top-k / top-p / min-p filter stands between the logprobs and the draw."""
        p = self.params
        return self._kernels is not None and p.top_k == 0 and p.top_p >= 1.0 and p.min_p == 0.0

    def advance(self, n: int) -> None:
        """`n` draws taken through `ahead=` (positions 0 .. n-1) are consumed."""
        if self.params.temperature == 0 or n <= 0:
            return
        self._key_at(n - 1)
        self._key = self._ahead[n - 1][0]
        del self._ahead[:n]

    def _key_at(self, i: int):
        import mlx.core as mx

        while len(self._ahead) <= i:
            key = self._ahead[-1][0] if self._ahead else self._key
            nxt, sub = mx.random.split(key)
            self._ahead.append((nxt, sub))
        return self._ahead[i][1]

    def __call__(self, logits, tokens: Sequence[int] = (), ahead: int | None = None):
        """`tokens`: the sequence so far (prompt, then generated tokens), for penalties and
        constraints. `ahead=i` draws with the key of the i-th draw from now without taking it
        (a draft position; `advance` takes the accepted ones); None takes the next draw."""
        import mlx.core as mx

        logits = self._prepare(logits, tokens)
        if self._kernels is not None:  # mlx's runs exp one element at a time: ~5 ms of 262K
            logprobs = logits - self._kernels.logsumexp(logits)
        else:
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        p = self.params
        if p.temperature == 0:
            return mx.argmax(logprobs, axis=-1), logprobs
        return self._draw(logprobs / p.temperature, self._draw_key(ahead)), logprobs

    def _draw_key(self, ahead: int | None):
        """The key of the draw `ahead` positions from now (not taken), or of the next draw
        (taken: None)."""
        if ahead is not None:
            return self._key_at(ahead)
        sub = self._key_at(0)
        self.advance(1)
        return sub

    def _uniform(self, ahead: int | None):
        """The draw's uniform number as `_draw` makes it (0 for a greedy draw: no key taken)."""
        import mlx.core as mx

        if self.params.temperature == 0:
            return mx.array(0.0, dtype=mx.float32)
        return mx.random.uniform(key=self._draw_key(ahead))

    def _prepare(self, logits, tokens: Sequence[int]):
        """The row's float32 logits with the padded ids, the never-ids, the logits processors
        and the constraint applied: what the logprobs are taken of."""
        import mlx.core as mx

        logits = logits.astype(mx.float32)
        if self._vocab_limit is not None and logits.shape[-1] > self._vocab_limit:
            mask = mx.arange(logits.shape[-1]) < self._vocab_limit
            logits = mx.where(mask, logits, -mx.inf)
        if self._never is not None:
            logits[self._never] = -mx.inf
        if self._processors:
            logits = self._process(logits, tokens)
        if self._matcher is not None:
            logits = self._matcher.mask(logits, tokens[self.prompt_len:])
        return logits

    @property
    def _prepares(self) -> bool:
        """Whether a fused draw needs `_prepare`'s row: the native draw itself applies the
        vocab limit and a logit bias, not the never-ids, penalties or a constraint."""
        return bool(self._never is not None or self._matcher is not None
                    or (self._processors and not self._bias_only))

    def _process(self, logits, tokens: Sequence[int]):
        """mlx-lm's logits processors take a [1, vocab] row and the tokens they look back on."""
        import mlx.core as mx

        recent = mx.array(list(tokens[-self.params.penalty_context:]), dtype=mx.int32)
        row = logits[None]
        for proc in self._processors:
            row = proc(recent, row)
        return row[0]

    def _draw(self, scores, sub):
        """Filter tempered scores (top-k, top-p, min-p; at least one token survives), then
        draw with `sub`, this draw's key."""
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_top_k

        p = self.params
        if 0 < p.top_k < scores.shape[-1]:
            scores = apply_top_k(scores, p.top_k)
        if p.top_p < 1.0:
            scores = _top_p(scores, p.top_p)
        if p.min_p > 0.0:
            scores = _min_p(scores, p.min_p)
        if self._kernels is not None and scores.dtype == mx.float32:
            # one uniform number per draw (inverse CDF) instead of Gumbel noise per token
            return self._kernels.sample(scores, mx.random.uniform(key=sub))
        return mx.random.categorical(scores, key=sub)


def draw_rows(logits, rows: Sequence[tuple[Sampler, Sequence[int], int | None]]):
    """One draw for each row of `logits` [R, vocab]: rows[i] = (sampler, tokens, ahead) as
    `Sampler.__call__` takes them. Returns the tokens (mx.array [R]), their logprobs
    ([R]) and, per row, its whole logprobs row where its request reports top logprobs (else
    None). Rows whose samplers are `fused` draw in one native call (the draw spread over the
    kernels' threads: a batch of 8 rows over Gemma 3's 262,144 logits ~1.4 ms, against ~9 ms
    as ~7 graph nodes a row); its bits are those of `Sampler.__call__`, so a row draws alike
    alone, in a batch and in a verify chunk, and every draw of a row takes the same route."""
    import mlx.core as mx

    if rows and all(s.fused for s, _, _ in rows):
        kernels, vocab = rows[0][0]._kernels, logits.shape[-1]
        temps = mx.array([s.params.temperature for s, _, _ in rows], dtype=mx.float32)
        u = mx.stack([s._uniform(at) for s, _, at in rows])
        if any(s._prepares for s, _, _ in rows):
            x = mx.stack([s._prepare(logits[i], toks) for i, (s, toks, _) in enumerate(rows)])
            tokens, picked = kernels.draw(x, temps, u)
        else:
            x = logits.astype(mx.float32)
            limit = mx.array([min(s._vocab_limit or vocab, vocab) for s, _, _ in rows],
                             dtype=mx.int32)
            tokens, picked = kernels.draw(x, temps, u, limit, *_biases([s for s, _, _ in rows]))
            if any(s.params.top_logprobs for s, _, _ in rows):  # their rows as _prepare has them
                x = mx.stack([s._prepare(logits[i], toks) if s.params.top_logprobs else x[i]
                              for i, (s, toks, _) in enumerate(rows)])
        full = [x[i] - kernels.logsumexp(x[i]) if s.params.top_logprobs else None
                for i, (s, _, _) in enumerate(rows)]
        return tokens, picked, full
    tokens, picked, full = [], [], []
    for i, (s, toks, at) in enumerate(rows):
        if s.fused:
            t, p, f = draw_rows(logits[i:i + 1], [(s, toks, at)])
            t, p, f = t[0], p[0], f[0]
        else:
            t, f = s(logits[i], toks, ahead=at)
            p, f = f[t], f if s.params.top_logprobs else None
        tokens.append(t)
        picked.append(p)
        full.append(f)
    return mx.stack(tokens), mx.stack(picked), full


def _biases(samplers: list[Sampler]) -> tuple:
    """The rows' logit biases as the native draw takes them: (ids [R, n] int32, -1 after a
    row's last entry; values [R, n] float32), or () where no row has one."""
    import mlx.core as mx

    width = max((len(s._bias[0]) for s in samplers if s._bias is not None), default=0)
    if not width:
        return ()
    ids, values = [], []
    for s in samplers:
        i, v = s._bias if s._bias is not None else (mx.zeros((0,), mx.int32),
                                                    mx.zeros((0,), mx.float32))
        if len(i) < width:
            i = mx.concatenate([i, mx.full((width - len(i),), -1, mx.int32)])
            v = mx.concatenate([v, mx.zeros((width - len(v),), mx.float32)])
        ids.append(i)
        values.append(v)
    return mx.stack(ids), mx.stack(values)


# mlx-lm's apply_top_p and apply_min_p, not compiled: mx.compile bakes the float in, so each
# new value compiled a kernel (~5 s on the CPU) while the whole batch waited.
def _top_p(scores, top_p: float):
    """Keep the most likely tokens whose probability mass reaches `top_p`."""
    import mlx.core as mx

    ordered = mx.sort(scores, axis=-1)
    probs = mx.exp(ordered.astype(mx.float32))
    above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    total = above[..., :1] + probs[..., :1]
    dropped = (above >= top_p * total).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(ordered, dropped, axis=-1)
    return mx.where(scores < threshold, -mx.inf, scores)


def _min_p(scores, min_p: float):
    """Keep the tokens at least `min_p` times as likely as the most likely one."""
    import mlx.core as mx

    floor = mx.max(scores, axis=-1, keepdims=True) + math.log(min_p)
    return mx.where(scores < floor, -mx.inf, scores)


def _row_matcher(constraint, tokenizer) -> RowMatcher | None:
    if constraint is None:
        return None
    if tokenizer is None:
        raise GenerationError("a constrained request needs the model's tokenizer; build the "
                              "Sampler with tokenizer=.")
    return RowMatcher(constraint, tokenizer)
