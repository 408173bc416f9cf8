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
rewound to an earlier turn restores to that turn's end.

The marker is what the tokenizer's chat template adds for `add_generation_prompt=True`; models
without a chat template get no turn ends. The marker is folded into the block keys' seed, so
records made with another chunking never match. `TurnModel` does the cutting: it wraps the
model callable of prefill chunks (decode steps are single tokens and never cut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import partial
from .blocks import tokens_bytes
from .cuts import TURN_END, cut_key

TURN_END_TAG = b"forkv-turn-end-v1"


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


def turn_ends(tokens: Sequence[int], marker: Sequence[int], block_size: int) -> list[int]:
    """Positions right after each occurrence of `marker` in `tokens` (block boundaries left
    out: block records cover those), ascending."""
    m = len(marker)
    if not m:
        return []
    first, marker = marker[0], list(marker)
    return [i + m for i, t in enumerate(tokens) if t == first and (i + m) % block_size
            and i + m <= len(tokens) and list(tokens[i:i + m]) == marker]


def turn_key(keyer, keys: Sequence[bytes], tokens: Sequence[int], end: int) -> bytes:
    """The key of the turn-end checkpoint at `end`: chained from the key of the block before
    (or the seed of the run's namespace, `keyer`) and the tokens since that block's end."""
    return cut_key(TURN_END_TAG, keyer, keys, tokens, end)


class TurnModel:
    """A text model callable that ends a chunk at every turn end inside it, and calls
    `on_end(end, cache)` with the evaluated caches at each turn end it reaches (chunk ends
    included)."""

    def __init__(self, model, ends: Sequence[int], on_end: Callable | None = None):
        self.model = model
        self.ends = list(ends)
        self.on_end = on_end

    def __call__(self, inputs, cache):
        import mlx.core as mx

        first = next(c.offset for c in cache if hasattr(c, "offset"))
        last = first + inputs.shape[1]
        logits, a = None, first
        for b in [e for e in self.ends if first < e < last] + [last]:
            logits = self.model(inputs[:, a - first:b - first], cache=cache)
            if self.on_end is not None and b in self.ends:
                mx.eval([c.state for c in cache])
                self.on_end(b, cache)
            a = b
        return logits


class TurnRecorder:
    """Checkpoints the turn ends of one run (the `on_end` of its TurnModel)."""

    def __init__(self, ck, keys: Sequence[bytes], tokens: Sequence[int], keyer):
        self.ck, self.keys, self.tokens, self.keyer = ck, keys, tokens, keyer

    def __call__(self, end: int, cache: list) -> None:
        ck, keyer = self.ck, self.keyer
        if end // ck.block_size > len(self.keys):
            return  # past the blocks this run knows keys for (decoded tokens)
        ck.cuts.record(TURN_END, turn_key(keyer, self.keys, self.tokens, end), cache, end,
                       self.tokens, keyer.tag)


class Turns:
    """A checkpointer's turn ends: the marker, and what runs need to cut, record and restore."""

    def __init__(self, ck, marker: Sequence[int]):
        self.ck = ck
        self.marker = tuple(marker)

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
        return turn_ends(tokens, self.marker, self.ck.block_size)

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
        return {e: turn_key(keyer, block_keys, tokens, e) for e in self.ends(tokens)}

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
        for end in reversed([e for e in self.ends(tokens[:len(tokens) - 1]) if e // B == k]):
            cache, arrays = ck.cuts.build(TURN_END, turn_key(keyer, keys, tokens, end), tokens,
                                          end, keys, keyer)
            if cache is None and arrays is None:
                continue  # not recorded: an earlier turn end may be
            if cache is None:
                return None, k  # its block records are not all there: a block restore decides
            if count:
                ck.count_restore(len(tokens), end)
            return Restored(cache, end, keys, {}, keyer), k
        return None, k

    def restore(self, restored, tokens: Sequence[int], count: bool = True,
                tried: int | None = None) -> int:
        """Move a block restore (`restored`, at a boundary) on to the furthest turn end after
        it in the same block, leaving at least one token to compute; the new position.
        `tried`: a block whose turn ends `restore_direct` found missing (not read again)."""
        ck, n, B = self.ck, restored.position, self.ck.block_size
        if tried is not None and n // B == tried:
            return n
        keyer = restored.keyer or ck.keyer
        for end in reversed(self.ends(tokens[:len(tokens) - 1])):
            if end <= n:
                break
            if end // B * B != n:
                continue  # its block's start is not restored
            key = turn_key(keyer, restored.keys, tokens, end)
            if ck.cuts.move(TURN_END, restored, key, tokens, end, count=count) is not None:
                return end
        return n
