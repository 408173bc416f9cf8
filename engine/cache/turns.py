"""Turn-end checkpoints: a chunk edge and a checkpoint wherever an assistant turn starts.

A chat's next prompt repeats the last prompt exactly up to its end — the chat template's
generation prompt (`<|im_start|>assistant\\n`, `<start_of_turn>model\\n`, ...) — and goes on
with the answer and a new message. Block records alone would restore only to the last 256-token
boundary before that point and compute the rest of the block again every turn. So every text
run also ends a chunk right after each occurrence of that *marker* (a pure function of the
tokens, like block boundaries: a fresh run of the same tokens cuts at the same places, so
every record stays exact against it), and the caches there are checkpointed as a partial-block
checkpoint (partial.py) under a key chained from the previous block's key and the tokens since.
A later prompt that goes through the same marker restores to right after it, and a conversation
rewound to an earlier turn restores to that turn's end. The record also holds the logits of the
turn end's last position (the head run on that one row, as in the last chunk of a fresh run of
the tokens up to there), so a prompt that ends right there — a fork of a final answer, a
repeated request, the other choices of n > 1 — restores whole and computes nothing.

The marker is what the tokenizer's chat template adds for `add_generation_prompt=True`; models
without a chat template get no turn ends. The marker is folded into the block keys' seed, so
records made with another chunking never match. `TurnModel` does the cutting: it wraps the
model callable of prefill chunks (decode steps are single tokens and never cut).
"""

from __future__ import annotations

import contextlib
import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence

from ..request.generate import run_pieces
from ..request.lasthead import last_position_only
from . import partial
from .blocks import as_list, shared_prefix, tokens_bytes
from .cuts import TURN_END, cut_key
from .layout import CacheKind

TURN_END_TAG = b"forkv-turn-end-v1"
LOGITS = "logits"  # a turn end's record: the logits of its last position


def turn_marker(tokenizer) -> tuple[int, ...]:
    """The tokens the chat template adds to start the assistant's turn; () if there is no
    template or its generation prompt is not a plain suffix."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return ()
    messages = [{"role": "user", "content": "x"}]
    try:
        without = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                     add_generation_prompt=False))
        with_ = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                   add_generation_prompt=True))
    except Exception:  # noqa: BLE001 - a template that cannot render this: no turn ends
        return ()
    if len(with_) <= len(without) or with_[:len(without)] != without:
        return ()
    return tuple(int(t) for t in with_[len(without):])


def turn_ends(tokens: Sequence[int], marker: Sequence[int], block_size: int,
              start: int = 0) -> list[int]:
    """Positions right after each occurrence of `marker` in `tokens` that starts at or after
    `start` (block boundaries left out: block records cover those), ascending."""
    m = len(marker)
    if not m:
        return []
    # Searched as packed int32 bytes (in C: a turn's tokens cost microseconds, not a Python
    # loop over the whole path); a hit counts only at a token boundary.
    data, pattern = tokens_bytes(tokens[start:]), tokens_bytes(marker)
    out, at = [], data.find(pattern)
    while at >= 0:
        if at % 4 == 0:
            end = start + at // 4 + m
            if end % block_size:
                out.append(end)
            at = data.find(pattern, at + 4)
        else:
            at = data.find(pattern, at + 1)
    return out


def turn_key(keyer, keys: Sequence[bytes], tokens: Sequence[int], end: int) -> bytes:
    """The key of the turn-end checkpoint at `end`: chained from the key of the block before
    (or the seed of the run's namespace, `keyer`) and the tokens since that block's end."""
    return cut_key(TURN_END_TAG, keyer, keys, tokens, end)


class TurnModel:
    """A text model callable that ends a chunk at every turn end inside it, and calls
    `on_end(end, cache, logits)` with the evaluated caches at each turn end it reaches (chunk
    ends included), and the last position's logits where `on_end.wants(end)` (else None)."""

    def __init__(self, model, ends: Sequence[int], on_end: Callable | None = None):
        self.model = model
        self.ends = list(ends)
        self.on_end = on_end
        self._head = False  # whether the last piece ran the head on its last position only

    def __call__(self, inputs, cache):
        return run_pieces(inputs, cache, self.ends, self._forward,
                          self._at_end if self.on_end is not None else None)

    def _forward(self, ids, cache: list, a: int, b: int):
        # At a turn end to be recorded the head runs on the last position only, as in the
        # last chunk of a fresh run of the tokens up to there: those logits, recorded, serve a
        # prompt that ends right there (a fork, a repeat) bit for bit. (Only then: a head row
        # costs ~0.1 s on a 262K vocabulary.)
        head = self.on_end is not None and b in self.ends and self.on_end.wants(b)
        with last_position_only(self.model) if head else contextlib.nullcontext():
            logits = self.model(ids, cache=cache)
        self._head = head
        return logits

    def _at_end(self, b: int, cache: list, logits) -> None:
        import mlx.core as mx

        end_logits = logits[0, -1] if self._head else None
        mx.eval([c.state for c in cache], *([end_logits] if self._head else []))
        self.on_end(b, cache, end_logits)


class TurnRecorder:
    """Checkpoints the turn ends of one run (the `on_end` of its TurnModel)."""

    def __init__(self, ck, keys: Sequence[bytes], tokens: Sequence[int], keyer):
        self.ck, self.keys, self.tokens, self.keyer = ck, keys, tokens, keyer

    def _key(self, end: int) -> bytes | None:
        if end // self.ck.block_size > len(self.keys):
            return None  # past the blocks this run knows keys for (decoded tokens)
        return turn_key(self.keyer, self.keys, self.tokens, end)

    def wants(self, end: int) -> bool:
        """Whether the turn end `end` is to be recorded (not there yet)."""
        key = self._key(end)
        return key is not None and not self.ck.store.contains(key, CacheKind.EXTRA)

    def __call__(self, end: int, cache: list, logits=None) -> None:
        key = self._key(end)
        if key is not None:
            self.ck.cuts.record(TURN_END, key, cache, end, self.tokens, self.keyer.tag,
                                {LOGITS: logits} if logits is not None else None)


class Turns:
    """A checkpointer's turn ends: the marker, and what runs need to cut, record and restore."""

    def __init__(self, ck, marker: Sequence[int]):
        self.ck = ck
        self.marker = tuple(marker)
        # The last `keys` answer: (keyer, tokens, {end: key}). A turn end's key reads only
        # the tokens before it, so ends inside the tokens a later call shares keep theirs.
        self._last: tuple[object, list[int], dict[int, bytes]] = (None, [], {})
        # The last `ends` answer: (tokens, ends). A turn's render, its prompt, its run and its
        # records all extend the path before them, so each searches only its own tokens.
        # Replaced whole (one assignment): safe to read from any thread.
        self._ends: tuple[list[int], list[int]] = ([], [])

    @classmethod
    def for_checkpointer(cls, ck) -> Turns | None:
        """Turn ends for a text model whose chat template has a generation prompt and whose
        caches can be checkpointed mid-block; None otherwise."""
        lm = ck.lm
        if getattr(lm, "is_vision", False) or not partial.supports_partial(ck):
            return None
        marker = turn_marker(getattr(lm, "tokenizer", None))
        if not marker or not any(hasattr(c, "offset") for c in lm.make_cache()):
            return None
        return cls(ck, marker)

    @property
    def seed_part(self) -> bytes:
        """What the block keys' seed folds in: this chunking."""
        return b"turn-ends:" + tokens_bytes(self.marker)

    def ends(self, tokens: Sequence[int]) -> list[int]:
        """`turn_ends` of `tokens`; those inside the tokens the last call shares with it are
        taken from that call (an end reads only the marker's tokens before it)."""
        return list(self._ends_of(as_list(tokens), owned=False))

    def _ends_of(self, now: list[int], owned: bool) -> list[int]:
        # `owned`: `now` is the caller's private copy, kept as is (no second copy)
        last_tokens, last_ends = self._ends
        same = shared_prefix(now, last_tokens)
        keep = bisect_right(last_ends, same)
        ends = last_ends[:keep] + turn_ends(now, self.marker, self.ck.block_size,
                                            max(0, same - len(self.marker) + 1))
        self._ends = (now if owned else list(now), ends)
        return ends

    def model(self, model, tokens: Sequence[int], keys: Sequence[bytes] | None,
              record: bool = True, keyer=None):
        """`model` cutting at the turn ends of `tokens` (and recording there, in `keyer`'s
        namespace), or `model` itself when `tokens` has none."""
        ends = self.ends(tokens)
        if not ends:
            return model
        on_end = (TurnRecorder(self.ck, keys, tokens, keyer or self.ck.keyer)
                  if record and keys is not None else None)
        return TurnModel(model, ends, on_end)

    def keys(self, tokens: Sequence[int], block_keys: Sequence[bytes], keyer=None
             ) -> dict[int, bytes]:
        """Keys of the turn-end checkpoints a run of `tokens` records, by position (for
        releasing them)."""
        keyer = keyer or self.ck.keyer
        now = list(tokens)  # a copy of its own (compared by slices, in C), shared with ends
        last_keyer, last_tokens, last = self._last
        same = shared_prefix(now, last_tokens) if last_keyer is keyer else -1
        ends = self._ends_of(now, owned=True)
        # The ends up to `same` are the last answer's first ones (ends ascend, and each reads
        # only the tokens before it): copied in C, only the new ends keyed.
        keep = bisect_right(ends, same)
        out = dict(itertools.islice(last.items(), keep))
        if len(out) < keep or list(out) != ends[:keep]:  # (not the last answer's: key them all)
            out, keep = {}, 0
        for e in itertools.islice(ends, keep, None):
            out[e] = turn_key(keyer, block_keys, tokens, e)
        self._last = (keyer, now, out)
        return dict(out)

    def is_recorded_end(self, tokens: Sequence[int], keyer) -> bool:
        """Whether `tokens` ends at a turn end recorded in `keyer`'s namespace (a restore of
        them all, with the last logits, may be there)."""
        ends = self.ends(tokens)
        if not ends or ends[-1] != len(tokens):
            return False
        key = turn_key(keyer, keyer.keys(tokens), tokens, len(tokens))
        return self.ck.store.contains(key, CacheKind.EXTRA)

    def restorable(self, tokens: Sequence[int], key_of: Callable[[int], bytes],
                   ends: Sequence[int] | None = None) -> Iterator[tuple[int, bytes, frozenset]]:
        """(end, key, arrays its record must hold) of each turn end a restore of `tokens`
        may go to (of `ends`, where given), furthest first. One at the very end of `tokens` (a
        fork of a final answer, a repeated request: nothing left to compute) counts only when
        it is recorded with its logits, which stand in for that last token's; its absence is
        no miss."""
        for end in reversed(self.ends(tokens) if ends is None else ends):
            key = key_of(end)
            if end < len(tokens):
                yield end, key, frozenset()
            elif self.ck.store.contains(key, CacheKind.EXTRA):
                yield end, key, frozenset({LOGITS})

    def restore_direct(self, tokens: Sequence[int], keyer, count: bool = True):
        """(a `Restored` at the furthest turn end in the block after the leading run of
        global records, built from those records and the turn end's checkpoint alone — one
        concatenation per global layer, the window and state block records not read — or
        None, and the block whose turn ends were tried). With None a block restore, and
        `restore` after it, decide."""
        from .checkpoint import Restored

        ck, B = self.ck, self.ck.block_size
        keys = keyer.keys(tokens)
        k = ck._global_run(keys, min(len(keys), (len(tokens) - 1) // B), tokens)
        # the turn ends in block k, by bisection: only theirs are keyed (not a deep chat's
        # every turn end, one hash each)
        every = self.ends(tokens)
        ends = every[bisect_left(every, k * B):bisect_left(every, (k + 1) * B)]
        for end, key, needs in self.restorable(
                tokens, lambda e: turn_key(keyer, keys, tokens, e), ends):
            cache, arrays = ck.cuts.build(TURN_END, key, tokens, end, keys, keyer,
                                          needs=needs)
            if cache is None and arrays is None:
                continue  # not recorded: an earlier turn end may be
            if cache is None:
                return None, k  # its block records are not all there: a block restore decides
            if count:
                ck.count_restore(len(tokens), end)
            return Restored(cache, end, keys, {}, keyer, arrays.get(LOGITS) if needs else None), k
        return None, k

    def restore(self, restored, tokens: Sequence[int], count: bool = True,
                tried: int | None = None) -> int:
        """Move a block restore (`restored`, at a boundary) on to the furthest turn end after
        it in the same block (the end of `tokens` too, with its logits); the new position.
        `tried`: a block whose turn ends `restore_direct` found missing (not read again)."""
        ck, n, B = self.ck, restored.position, self.ck.block_size
        if tried is not None and n // B == tried:
            return n
        keyer = restored.keyer or ck.keyer
        candidates = self.restorable(tokens, lambda e: turn_key(keyer, restored.keys, tokens, e))
        arrays = ck.cuts.advance(TURN_END, restored, tokens, candidates, count=count)
        if arrays is not None:
            restored.logits = arrays.get(LOGITS) if restored.position == len(tokens) else None
        return restored.position
