"""Restore the longest checkpointed prefix of a token sequence, and record new boundaries.

`restore(tokens)` finds the longest block-aligned prefix whose records are all there — each
kind lists the blocks it reads (global: every block; window: those covering the window; state:
the last one) — verifies each against the requested tokens, and rebuilds the caches. A missing,
corrupt or mismatched record is a miss: it is dropped and a shorter prefix is tried, down to
none. `recorder(tokens)` gives the boundary hook that snapshots every new block.

Every request carries its namespace (tenant) as a `BlockKeyer` (`keyer_for(namespace)`): it
seeds the request's keys and tags its records, and a restore takes a record only if its tag
is the request's, so one checkpointer and one store serve every tenant without one tenant's
records ever serving another's prompt. Methods without a `keyer` use the engine's own
namespace.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..request.generate import BoundaryHook
from . import kinds as _kinds
from .blocks import BlockKeyer, tokens_bytes
from .cuts import CUT_NAMES, Cuts
from .layout import CacheKind
from .recorder import SequenceRecorder
from .records import Record, rebuild
from .recordstore import RecordStore
from .turns import Turns

_STAT_KINDS = sorted(_kinds.record_names() | set(CUT_NAMES))
_MAX_KEYERS = 4096  # namespaces whose key builders are kept


@dataclass(slots=True)
class CheckpointStats:
    requests: int = 0
    tokens_reused: int = 0
    tokens_computed: int = 0
    blocks_recorded: int = 0
    restore_s: float = 0.0
    # Per record kind, and "turn_end" / "image_end" for the cuts there (cuts.py)
    hits: dict = field(default_factory=lambda: dict.fromkeys(_STAT_KINDS, 0))
    misses: dict = field(default_factory=lambda: dict.fromkeys(_STAT_KINDS, 0))
    rejected: int = 0  # records that failed verification or decoding
    turn_ends_recorded: int = 0
    image_ends_recorded: int = 0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}



@dataclass(slots=True)
class Restored:
    cache: list
    position: int  # tokens the cache already holds (0 = nothing restored)
    keys: list[bytes]  # keys of every full block of the requested tokens
    extra: dict = field(default_factory=dict)  # arrays of the EXTRA record at `position`
    keyer: BlockKeyer | None = None  # the request's namespace
    # The last token's logits when `position` is the whole prompt (a turn end's record
    # holds them): nothing is left to compute.
    logits: object = None


class Checkpointer:
    def __init__(self, lm, store: RecordStore, block_size: int = 256, namespace: str = ""):
        self.lm = lm
        self.layout = lm.layout
        self.store = store
        self.block_size = block_size
        for tier in getattr(store, "tiers", None) or [getattr(store, "disk", None)]:
            if hasattr(tier, "bind_model"):  # a persistent store holds one model's checkpoints
                tier.bind_model(lm.fingerprint)
        self.enabled = self.layout.can_checkpoint
        self.kinds = set(self.layout.kinds) - {CacheKind.UNKNOWN}
        if getattr(lm, "is_vision", False):
            # Vision models keep position state outside the caches (M-RoPE offsets): a
            # boundary is restorable only with its EXTRA record (see vision/ckpt.py).
            self.kinds.add(CacheKind.EXTRA)
        self.stats = CheckpointStats()
        # Restore timing hook (benchmarks; see `timed`): None times nothing.
        self.timings: dict[str, float] | None = None
        self.cuts = Cuts(self)  # checkpoints off the block boundaries (turn and image ends)
        # Chunk edges and checkpoints after each generation prompt (None: blocks only).
        self.turns = Turns.for_checkpointer(self)
        self._keyers: dict[str, BlockKeyer] = {}
        self.keyer = self.keyer_for(namespace)  # the engine's own namespace

    def keyer_for(self, namespace: str | None = None) -> BlockKeyer:
        """The key builder of `namespace` (None: the engine's own): block keys seeded with the
        model, block size, namespace and chunking, and the tag its records carry."""
        if namespace is None:
            return self.keyer
        keyer = self._keyers.get(namespace)
        if keyer is None:
            if len(self._keyers) >= _MAX_KEYERS:  # (cheap to make again: a few hashes)
                self._keyers.clear()
            keyer = self._keyers[namespace] = BlockKeyer(
                self.lm.fingerprint, self.block_size, namespace,
                self.turns.seed_part if self.turns else b"")
        return keyer

    @contextlib.contextmanager
    def timed(self) -> Iterator[dict[str, float]]:
        """Time the restores run inside the block (forkv bench restore): the dict it yields
        gets the seconds spent reading records (`read`) and building turn-end caches from them
        (`build`). One timer at a time; restores on other threads meanwhile count too."""
        self.timings = spent = {"read": 0.0, "build": 0.0}
        try:
            yield spent
        finally:
            self.timings = None

    def add_time(self, part: str, since: float) -> None:
        """Add the seconds since `since` (a perf_counter) to `timings[part]`, when timed."""
        if self.timings is not None:
            self.timings[part] += time.perf_counter() - since

    def read_record(self, key: bytes, kind: str) -> Record | None:
        """The store's record under (`key`, `kind`), unverified; timed as `read`."""
        t = time.perf_counter()
        try:
            return self.store.get(key, kind)
        finally:
            self.add_time("read", t)

    # -- restore -----------------------------------------------------------------------------
    def restore(self, tokens: Sequence[int], extras: dict | None = None,
                barriers: Sequence[int] = (), count: bool = True,
                keyer: BlockKeyer | None = None) -> Restored:
        """Caches for the longest restorable block prefix of `tokens` (always leaving one
        token to compute) in `keyer`'s namespace. A boundary inside a span in `barriers`
        ((start, end) pairs) is skipped. `count=False` (the engine's own record jobs) leaves the
        request and token counters alone; record hits and misses still count."""
        t0 = time.perf_counter()
        stats = self.stats if count else type(self.stats)()
        stats.requests += 1
        keyer = keyer or self.keyer
        keys = keyer.keys(tokens, extras)
        n, extra = 0, None
        if self.enabled:
            n_max = min(len(keys), (len(tokens) - 1) // self.block_size)
            for k in range(self._global_run(keys, n_max, tokens), 0, -1):
                pos = k * self.block_size
                if any(s < pos < e for s, e in barriers):
                    continue
                got = self._try(keys, tokens, k, keyer.tag)
                if got is not None:
                    (cache, extra), n = got, pos
                    break
        if n == 0:
            cache = self.lm.make_cache()
        stats.tokens_reused += n
        stats.tokens_computed += len(tokens) - n
        stats.restore_s += time.perf_counter() - t0
        return Restored(cache, n, keys, extra.arrays if extra is not None else {}, keyer)

    def restore_bound(self, tokens: Sequence[int], keyer: BlockKeyer | None = None) -> int:
        """The furthest position any record could restore `tokens` to (one token left, unless
        `tokens` ends at a turn end recorded in `keyer`'s namespace, whose record holds the
        last logits)."""
        bound = (len(tokens) - 1) // self.block_size * self.block_size if self.enabled else 0
        if self.enabled and self.turns is not None:
            bound = max([bound, *self.turns.ends(tokens[:len(tokens) - 1])])
            if self.turns.is_recorded_end(tokens, keyer or self.keyer):
                bound = len(tokens)
        return bound

    def count_restore(self, total: int, reused: int) -> None:
        """Count tokens restored without the records (a live cache, live.py): `total` > 0
        counts a request of that many tokens; `reused` moves tokens from computed to
        reused."""
        if total:
            self.stats.requests += 1
        self.stats.tokens_reused += reused
        self.stats.tokens_computed += total - reused

    def _global_run(self, keys, n_max: int, tokens) -> int:
        """How many leading blocks have global records (all blocks, if there are no global
        layers); restores can go no further."""
        if CacheKind.GLOBAL not in self.kinds:
            return n_max
        for k in range(n_max):
            if not self.store.contains(keys[k], CacheKind.GLOBAL):
                return k
        return n_max

    def load_global_run(self, keys, tokens, k: int, tag: bytes) -> list[dict] | None:
        """The arrays of the global records of blocks 0..k-1, verified; None at a miss. (All
        blocks, if the model has no global layers: then there is nothing to read.)"""
        if CacheKind.GLOBAL not in self.kinds:
            return []
        out, B = [], self.block_size
        for b in range(k):
            expect = tokens_bytes(tokens[b * B:(b + 1) * B])
            record = self._load(keys[b], CacheKind.GLOBAL, expect, tag)
            if record is None:
                return None
            out.append(record.arrays)
        return out

    def _load(self, key: bytes, kind: str, expect: bytes, tag: bytes) -> Record | None:
        record = self.read_record(key, kind)
        if record is None:
            self.stats.misses[kind] += 1
            return None
        if record.tokens != expect or record.namespace != tag or not self._names_ok(record):
            # Same key, other tokens or another namespace (a hash collision or a tampered
            # index): never reuse.
            self.stats.rejected += 1
            self.store.discard(key, kind)
            return None
        self.stats.hits[kind] += 1
        return record

    def _names_ok(self, record: Record) -> bool:
        """Every array belongs to a leaf of the record's kind (the kind checks the rest)."""
        if record.kind == CacheKind.EXTRA:
            return bool(record.arrays)
        labels = {leaf.label for leaf in self.layout.leaves(record.kind)}
        return bool(labels) and all(any(name.startswith(label + ".") for label in labels)
                                    for name in record.arrays)

    def _try(self, keys, tokens, k: int, tag: bytes) -> tuple[list, Record | None] | None:
        B = self.block_size
        pos = k * B
        records: dict[str, dict[int, Record]] = {}
        # Cheapest first: the extra and state records at block k-1, then the window, the
        # global chain last.
        def order(n):
            return (n != CacheKind.EXTRA, not _kinds.whole_prefix(n), n == CacheKind.GLOBAL, n)

        for kind in sorted(self.kinds, key=order):
            blocks = (range(k - 1, k) if kind == CacheKind.EXTRA
                      else self.layout.blocks(kind, pos, B))
            got = records[kind] = {}
            for b in blocks:
                end = (b + 1) * B
                expect = tokens_bytes(tokens[:end] if _kinds.whole_prefix(kind)
                                      else tokens[end - B:end])
                got[b] = self._load(keys[b], kind, expect, tag)
                if got[b] is None:
                    return None
        extra = records.pop(CacheKind.EXTRA, {}).get(k - 1)
        try:
            cache = rebuild(self.lm.make_cache(), self.layout, pos, B, records)
            return cache, extra
        except (KeyError, ValueError, AssertionError, TypeError):
            # Arrays that do not fit this model (shape, dtype, names): treat as a miss.
            self.stats.rejected += 1
            return None

    def restore_run(self, tokens: Sequence[int], count: bool = True,
                    keyer: BlockKeyer | None = None) -> Restored:
        """`restore` for a text run: the furthest checkpointed turn end in the block after the
        leading run of global records, built from those and its own checkpoint alone
        (turns.py); else the longest block prefix, then on to a turn end in the next
        block. A turn end at the very end of `tokens` restores all of them, with the last
        logits in `logits`."""
        tried = None
        if self.turns is not None and self.enabled:
            t0 = time.perf_counter()
            direct, tried = self.turns.restore_direct(tokens, keyer or self.keyer, count)
            if direct is not None:
                self.stats.restore_s += time.perf_counter() - t0
                return direct
        r = self.restore(tokens, count=count, keyer=keyer)
        if self.turns is not None:
            self.turns.restore(r, tokens, count, tried)
        return r

    def model_for(self, tokens: Sequence[int], keys: Sequence[bytes] | None = None,
                  keyer: BlockKeyer | None = None):
        """The model callable a text run of `tokens` prefills with: one that also cuts (and,
        given the block keys, records) at turn ends, or the plain model."""
        model = self.lm.model
        if self.turns is None:
            return model
        return self.turns.model(model, tokens, keys, keyer=keyer or self.keyer)

    def checkpoint_keys(self, tokens: Sequence[int], keyer: BlockKeyer | None = None,
                        keys: list[bytes] | None = None) -> list[bytes]:
        """Every key a run of `tokens` records under: its full blocks (`keys`, where the
        caller has them), then its turn ends."""
        keyer = keyer or self.keyer
        keys = keyer.keys(tokens) if keys is None else keys
        turns = self.turns.keys(tokens, keys, keyer) if self.turns else {}
        return keys + list(turns.values())

    # -- release -----------------------------------------------------------------------------
    def release(self, keys: Sequence[bytes]) -> int:
        """Discard every record of every kind stored under `keys` (blocks no one will ask for
        again); returns how many records were dropped."""
        dropped = 0
        for key in keys:
            for kind in sorted(_kinds.record_names()):
                if self.store.contains(key, kind):
                    self.store.discard(key, kind)
                    dropped += 1
        return dropped

    # -- record ------------------------------------------------------------------------------
    def put_record(self, key: bytes, record: Record) -> None:
        """Store `record` under `key` (a record the kinds do not make: vision position
        state at a boundary)."""
        self.store.put(key, record)

    def recorder(self, keys: list[bytes], extras: dict | None = None,
                 keyer: BlockKeyer | None = None) -> BoundaryHook | None:
        """The hook that records each block boundary a run reaches (prefill and decode)."""
        if not self.enabled:
            return None
        return SequenceRecorder(self, keys, extras, keyer or self.keyer)
