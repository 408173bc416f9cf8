"""Live caches: "fast" reuse continues a recently finished request's cache at any token.

Records restore only at canonical cuts (block boundaries, turn ends), so an exact request
recomputes everything after the last cut before it diverges: up to a block. A request in
`reuse="fast"` mode may instead continue the cache of a request that just finished (or just
finished its prefill), cut back to the longest prefix the two share, as llama.cpp continues a
slot's KV: global layers are sliced to any length, a sliding-window ring can go back as far as
it still holds the window (a ring right after prefill holds W-1 tokens plus its last chunk,
after decoding W), and recurrent state only to the very token it holds. The tokens after the
cut are then prefilled in chunks that begin there, so the logits differ from a fresh run's by
the rounding of another chunk split (`forkv bench serve` publishes the drift). Nothing a fast
request computes is recorded from its own cache: when its entry leaves the pool, a record job
prefills the same tokens canonically, so records stay exact for every later restore.

An exact request's prompt cache joins the pool too, where every layer is global K/V: its
tokens were computed on the canonical cuts, so the next request of the conversation (the same
prompt, an answer and a new message) takes it over at the last canonical cut they share, with
the very arrays a restore would build, and without reading records or copying the cache
(`best_canonical`, `hand_off`: the entry leaves the pool with it).

Entries are kept per namespace (a request continues only its own tenant's caches), in RAM
only, bounded in bytes and count, least recently used first out. Caches handed out are new
objects over the entry's arrays (mlx arrays are values), so an entry serves any number of
forks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import kinds as _kinds
from .kinds.base import copy_array, sharing
from .kinds.kv import GlobalKind as _GLOBAL
from .kinds.kv import SplitKV
from .blocks import as_list, shared_prefix

REUSE_MODES = ("exact", "fast")


@dataclass(slots=True, eq=False)
class LiveEntry:
    tokens: list[int]  # what the cache holds, in order
    cache: list  # single-row caches; never mutated (take() hands out new objects)
    tag: bytes  # the namespace's tag
    keys: frozenset  # checkpoint keys of `tokens` (release drops entries that hold any)
    nbytes: int
    on_leave: Callable | None = None  # queues the record job of a fast request's tokens
    canonical_to: int = 0  # its first tokens computed on the canonical cuts (an exact prompt)
    # An entry whose global K/V equal this one's over all of this one's tokens, bit for bit
    # (found so, or through a chain of such: see `_chain`): a later entry that equals it
    # needs no compare of this one. It may have left the pool (only its tokens are kept).
    view_of: LiveEntry | None = None
    # id(pool entry) -> n: that entry's K/V differ from this one's within their first n
    # tokens (a compare that failed: not run again on each later put whose chain reaches
    # this entry); pruned to the pool's entries
    differs: dict = field(default_factory=dict)
    # (entry, p): its global K/V over the first p tokens are that entry's (a sibling's), bit
    # for bit, held as views of them (`SplitKV`); that entry may have left the pool
    split_of: tuple | None = None


@dataclass(slots=True)
class LiveStats:
    puts: int = 0
    hits: int = 0  # requests that continued a live cache
    tokens: int = 0  # tokens those requests took from live caches
    handed: int = 0  # exact requests that took an exact prompt's cache over
    beyond_records: int = 0  # of which past what the records would have restored
    evicted: int = 0
    released: int = 0
    replaced: int = 0  # entries that left for a newer one holding the very same tokens
    split: int = 0  # entries that hold a sibling's prefix as views of its K/V (SplitKV)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


_SHARE_MIN = 256  # shorter shared prefixes are not worth an equality check


_UINT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def same_bits(pairs: list) -> bool:
    """Whether each pair (a, b) of mlx arrays holds the same bits (shape, dtype and every
    element's bytes). On the CPU through numpy over unsigned views, all pairs evaluated at
    once: mx.array_equal on float16 K/V ran ~0.3 GB/s here (a 2K-token SmolLM2 entry's 47 MB
    took ~140 ms, ~8 ms this way), on the engine thread in front of every request's first
    token."""
    import mlx.core as mx
    import numpy as np

    if any(a.shape != b.shape or a.dtype != b.dtype for a, b in pairs):
        return False
    uints = [getattr(mx, _UINT_OF_SIZE[a.dtype.size]) for a, _ in pairs]  # (dtypes match)
    views = [(mx.view(a, u), mx.view(b, u)) for (a, b), u in zip(pairs, uints)]
    if mx.default_device() != mx.cpu:  # (a GPU compares its own memory faster)
        return all(bool(mx.array_equal(a, b).item()) for a, b in views)
    mx.eval(views)
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in views)


def _share_kv(short, long_, p: int, check_from: int = 0) -> bool:
    """`short`'s K/V (holding p tokens) as slices of `long_`'s first p, if equal bit for bit
    from token `check_from` on (the tokens before it known equal); global-layer caches only
    (sliding windows and state are each entry's own). Whether the layer reads `long_`'s now
    (True for a layer that is not global K/V: nothing of it is shared)."""
    import mlx.core as mx

    if isinstance(short, SplitKV) or isinstance(long_, SplitKV):
        return False  # (held in parts: not a view, nor one to be viewed)
    if _kinds.kind_of(short) is not _GLOBAL:
        return True
    if (type(short) is not type(long_) or short.keys is None or long_.keys is None
            or short.offset != p or long_.offset < p or short.keys.dtype != long_.keys.dtype):
        return False
    keys, values = long_.keys[..., :p, :], long_.values[..., :p, :]
    a = check_from
    if keys.shape != short.keys[..., :p, :].shape:
        return False
    if a < p and not same_bits([(keys[..., a:, :], short.keys[..., a:p, :]),
                                (values[..., a:, :], short.values[..., a:p, :])]):
        return False
    mx.eval(keys, values)  # (views of long_'s buffer: evaluated here, on the engine thread)
    short.keys, short.values = keys, values
    return True


def _sibling_prefix(new, old, p: int) -> tuple | None:
    """(keys, values) of `old`'s first `p` tokens as views, where `new` (holding more than
    `p`) is a global-layer K/V cache of the same class and dtype that a `SplitKV` over them
    can stand for; None otherwise."""
    if isinstance(old, SplitKV):
        if p > old.p or type(new) is not old.cache_type:
            return None
        keys, values = old.prefix(p)
    elif (_kinds.kind_of(old) is _GLOBAL and old.keys is not None and old.offset >= p
            and type(old) is type(new)):
        keys, values = old.keys[..., :p, :], old.values[..., :p, :]
    else:
        return None
    if (_kinds.kind_of(new) is not _GLOBAL or new.keys is None or new.offset <= p
            or keys.dtype != new.keys.dtype or keys.shape != new.keys[..., :p, :].shape):
        return None
    return keys, values


def _chain(entry: LiveEntry) -> list[LiveEntry]:
    """`entry` and the entries its view_of chain reaches, in order. Each equals the next bit
    for bit over its own tokens (mlx arrays are values: that stays true), so two entries with
    one root (the last) are equal over the tokens they share, with no compare; and an entry
    found to differ from one on the chain within n tokens differs from `entry` there too."""
    out, seen = [entry], {id(entry)}
    while entry.view_of is not None and id(entry.view_of) not in seen:
        entry = entry.view_of
        out.append(entry)
        seen.add(id(entry))
    for e in out[:-2]:  # each equals the root over its own tokens: point there, so entries
        e.view_of = out[-1]  # that left the pool between are freed and chains stay short
    return out


def _root(entry: LiveEntry) -> LiveEntry:
    return _chain(entry)[-1]


def _kinds_of(cache: list) -> list:
    return [_kinds.kind_of(c) for c in cache]


def _reach(cache: list, n_tokens: int) -> int:
    """The fewest tokens `cache` (holding `n_tokens`) can be cut back to (can_cut holds for
    every length from some point on)."""
    kinds = _kinds_of(cache)
    lo, hi = 0, n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if all(k is not None and k.can_cut(c, n_tokens, mid) for c, k in zip(cache, kinds)):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _evaluated(cache: list) -> list:
    import mlx.core as mx

    mx.eval([c.state for c in cache if getattr(c, "keys", True) is not None])
    return cache


def cut_limit(cache: list, n_tokens: int, want: int) -> int:
    """The longest prefix <= `want` that `cache` (holding `n_tokens` tokens) can be cut back
    to; 0 when none."""
    u = min(want, n_tokens)
    ok = all(k is not None and k.can_cut(c, n_tokens, u) for c, k in zip(cache, _kinds_of(cache)))
    return u if ok else 0


def rings(cache: list) -> list:
    """The sliding-window rings of `cache` in time order (None for other layers): a fast
    request keeps them from before its last prefill chunk (references, no copy), since the
    chunk's update trims them to W - 1 tokens and a fork often diverges just before it."""
    return [k.ring(c) if k is not None else None for c, k in zip(cache, _kinds_of(cache))]


def widen(cache: list, before: list, n_new: int, make_cache: Callable) -> list:
    """`cache` with each sliding-window ring holding its `rings` from before the last
    `n_new` tokens as well, so a later request can cut it back into those tokens (the last
    prefill chunk, or an answer: decoding trims a ring to W), or `cache` itself when no ring
    gains a token."""
    fresh = make_cache()
    out = [k.widen(c, new, old, n_new) if k is not None else None
           for c, new, old, k in zip(cache, fresh, before, _kinds_of(cache))]
    if all(c is None for c in out):
        return cache
    return _evaluated([new or c for new, c in zip(out, cache)])


def cut(cache: list, n_tokens: int, u: int, make_cache: Callable) -> list:
    """New caches holding the first `u` tokens of `cache` (which must allow it: cut_limit)."""
    return _evaluated([k.cut(c, new, n_tokens, u)
                       for c, new, k in zip(cache, make_cache(), _kinds_of(cache))])


def cache_nbytes(cache: list) -> int:
    return sum(int(getattr(c, "nbytes", 0) or 0) for c in cache)


def share(cache: list, make_cache: Callable, room: bool = False) -> list:
    """Caches equal to `cache`, new objects holding its arrays: nothing is copied until one
    side writes, and then only what it writes over (mlx-lm's K/V caches grow by copying
    anyway, sliding windows rewrite a ring of a few hundred tokens). `room`: global layers
    hold the whole buffer, the room after their tokens too (a decoding row's: its updates
    write there, in place where it owns the buffer's tail: native/kvcache.py `own_tails`),
    not a slice of their tokens that its first update must copy whole to grow."""
    with sharing():
        return [_whole_buffer(c, new) if room and k is _GLOBAL and c.keys is not None
                else k.load_whole(new, k.save_whole(c))
                for c, new, k in zip(cache, make_cache(), _kinds_of(cache))]


def _whole_buffer(cache, fresh):
    """`fresh` holding `cache`'s tokens in new array objects over its whole buffers (inside
    `sharing()`: an update assigns into its array object, which `cache` must not see)."""
    fresh.keys, fresh.values = copy_array(cache.keys), copy_array(cache.values)
    fresh.offset = cache.offset
    return fresh


class LivePool:
    """Recently finished caches, by namespace tag, least recently used first out."""

    def __init__(self, make_cache: Callable, budget_bytes: int, max_entries: int = 32,
                 max_canonical: int = 4, block_size: int = 256):
        self.make_cache = make_cache
        self.block_size = block_size  # (canonical chunks never cross a block boundary)
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        # exact prompts' caches kept at once: one per conversation that is between turns
        # (each is taken over by its next turn), not a second copy of every record in RAM
        self.max_canonical = max_canonical
        self.entries: OrderedDict[int, LiveEntry] = OrderedDict()
        self.nbytes = 0
        self.stats = LiveStats()
        self.on_grow: Callable[[], None] | None = None  # the RAM budget's settle (budget.py)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0 and self.max_entries > 0

    def put(self, tokens: Sequence[int], cache: list, tag: bytes, keys: Sequence[bytes] = (),
            on_leave: Callable | None = None, canonical_to: int = 0,
            same_as: tuple[LiveEntry, int] | None = None) -> LiveEntry | None:
        """Keep `cache` (holding `tokens`; the pool owns both from now on) for later requests of
        the namespace `tag`. Entries whose tokens are a prefix of another's stay too (the
        cache after a prompt holds more of its sliding windows than the one after its
        answer). One that is not kept leaves at once (`on_leave` runs). `same_as` (an entry, n):
        `cache`'s global K/V of the first n tokens are that entry's, bit for bit (the request
        continued it, or it is the request's own prompt's)."""
        nbytes = cache_nbytes(cache)
        # (a cache that does not hold exactly `tokens` would be cut in the wrong place)
        if (not self.enabled or not tokens or nbytes > self.budget_bytes
                or any(getattr(c, "offset", len(tokens)) != len(tokens) for c in cache)):
            if on_leave is not None:
                on_leave()
            return None
        entry = LiveEntry(as_list(tokens), cache, tag, frozenset(keys), nbytes, on_leave,
                          canonical_to)
        self._share_prefixes(entry, same_as)
        self._drop_twins(entry)  # (after: a twin found equal reads `entry`, its chain goes on)
        for e in _chain(entry):  # (facts about entries that left go: the dicts stay bounded)
            e.differs = {k: n for k, n in e.differs.items() if k in self.entries}
        self.entries[id(entry)] = entry
        self.nbytes += nbytes
        self.stats.puts += 1
        self._trim()
        if self.on_grow is not None:
            self.on_grow()
        return entry if id(entry) in self.entries else None

    def _drop_twins(self, new: LiveEntry) -> None:
        """Entries of `new`'s namespace holding exactly its tokens leave (their record jobs
        queued, as on eviction) where `new` can be cut back as far and is as canonical: they
        serve nothing `new` cannot, and each cost every later put a compare of its whole K/V
        (a request sent again, a retried tool call: the same 2K-token prompt's entries piled
        up, ~10 ms of compare each on the engine thread before every first token)."""
        n, reach = len(new.tokens), None
        for k, old in list(self.entries.items()):
            if (old.tag != new.tag or len(old.tokens) != n or old.canonical_to > new.canonical_to
                    or old.tokens != new.tokens):
                continue
            reach = _reach(new.cache, n) if reach is None else reach
            if reach <= _reach(old.cache, n):
                self._leave(self.entries.pop(k), "replaced")

    def _share_prefixes(self, new: LiveEntry,
                        same_as: tuple[LiveEntry, int] | None = None) -> None:
        """One buffer for the global layers' K/V of a conversation's entries: where `new` and
        an entry of its namespace hold one's tokens as the other's prefix (a prompt and its
        answer, an answer and the next prompt), the shorter's keys and values become slices of
        the longer's, once they are equal bit for bit (a fork's cache continues its source's
        arrays, but a recomputed prefix may round differently: then both keep their own).
        Without this every turn of a 32K-token chat kept its own copy of the 32K tokens' K/V
        (Gemma 3 270M: ~110 MiB an entry). Byte accounting is unchanged (each entry counts
        its own slices), so the budget errs on the safe side. Two exact prompts' entries
        (both canonical through the shared tokens) are compared from the last block boundary
        on only: before it both ran the same canonical chunks (cuts are a function of the
        tokens), so their K/V are equal bit for bit, as their records are; only the shorter
        one's last chunk may end where the longer one's does not. (Comparing a 14K-token
        chat's whole K/V cost ~28 ms a turn on the engine thread, in front of every other
        request.) Nor is what is known compared at all. Entries with one `_root` equal each
        other where they hold, and their tokens begin the root's: neither their tokens nor
        their K/V are compared, so a conversation's turn compares only its own new tokens, not
        every earlier turn's whole K/V again (a fast chat's 60th turn compared ~30 entries'
        K/V: ~1.2 s of demo:qwen3:tiny's engine thread, ~3 s of SmolLM2's; a prompt restored
        from records and sent again compared every earlier answer of it from token 0). An
        entry with the source's root is compared past `same_as`'s first tokens only, and one
        found to differ from `new`'s chain (`differs`) is not compared again."""
        source, known = same_as if same_as is not None else (None, 0)
        source_root = _root(source) if source is not None else None
        olds = sorted((e for e in self.entries.values() if e.tag == new.tag and e.cache),
                      key=lambda e: len(e.tokens), reverse=True)
        # The sibling `new` shares most with (both go on past what they share), if at least
        # half of `new`: `new` then holds that prefix as views of it (`_split_from`), and an
        # entry holding no more than the prefix need not become a view of `new`. (Longest
        # first: a sibling sharing p comes before every entry of p tokens or fewer.)
        sibling, based = None, False  # (based: `new` became a view, or one a view of it)
        for old in olds:
            chain, old_root = _chain(new), _root(old)  # (new's changes as it comes to read one)
            same_root = old_root is chain[-1]
            if same_root:  # (both begin the root's tokens: the shorter begins the longer)
                p = min(len(old.tokens), len(new.tokens))
            elif old is source:  # (`new`'s first `known` tokens are its, as their K/V)
                p = known + shared_prefix(old.tokens[known:], new.tokens[known:])
            else:
                p = shared_prefix(old.tokens, new.tokens)
            if p < _SHARE_MIN:
                continue
            if p not in (len(old.tokens), len(new.tokens)):  # siblings: both go on past p
                if 2 * p >= len(new.tokens) and (sibling is None or p > sibling[1]):
                    sibling = (old, p)
                continue
            if p == len(old.tokens) < len(new.tokens) and sibling is not None \
                    and p <= sibling[1]:
                continue  # (it begins the sibling's prefix too: `new` will read that)
            if any(isinstance(c, SplitKV) for c in old.cache):
                continue  # (held in parts, it is no view and has none to give)
            short, long_ = (old, new) if p == len(old.tokens) else (new, old)
            check_from = self._known_equal(new, old, p, source, source_root, known)
            if same_root:
                check_from = p  # both equal one entry over their own tokens: so over p
            elif any(e.differs.get(id(old), p + 1) <= p for e in chain):
                continue  # found to differ from `new`'s chain where both hold: no compare
            if all([_share_kv(a, b, p, check_from) for a, b in zip(short.cache, long_.cache)]):
                short.view_of = long_
                based = True
                for k, n in short.differs.items():  # (long_ equals it where those differ)
                    long_.differs[k] = min(n, long_.differs.get(k, n))
            else:
                new.differs[id(old)] = min(p, new.differs.get(id(old), p))
        if sibling is not None and not based:
            self._split_from(new, *sibling, source_root, known, source)
        elif based and new.view_of is None:
            self._rebase_splits(new)

    def _known_equal(self, new: LiveEntry, old: LiveEntry, p: int, source, source_root,
                     known: int) -> int:
        """How far `new`'s and `old`'s global K/V are known equal without a compare, within
        their first `p` tokens: both canonical through p, to the last block boundary before
        it (cuts are a function of the tokens); `old` the source `new` continued (or of its
        root), over `new`'s first `known` tokens (it equals the source over what both hold)."""
        canonical = min(new.canonical_to, old.canonical_to) >= p
        check_from = (p - 1) // self.block_size * self.block_size if canonical else 0
        if old is source or _root(old) is source_root:
            check_from = max(check_from, min(known, p))
        return check_from

    def _rebase_splits(self, new: LiveEntry) -> None:
        """Split entries whose prefix is that of an entry now on `new`'s chain read it from
        `new`'s buffer instead: entries that became views of `new` left their old buffer,
        which the splits' views would otherwise keep whole (a rewind's next turn kept the
        conversation's K/V twice). No compare: the split equals its base over its prefix,
        the base `new` over the base's tokens."""
        for e in self.entries.values():
            if e.split_of is None or e is new or e.tag != new.tag:
                continue
            base, p = e.split_of
            if base is new or _root(base) is not new or p > len(new.tokens):
                continue
            if not all(isinstance(c, SplitKV) <= (_kinds.kind_of(n) is _GLOBAL
                                                   and n.keys is not None and n.offset >= p)
                       for c, n in zip(e.cache, new.cache)):
                continue
            for c, n in zip(e.cache, new.cache):
                if isinstance(c, SplitKV):
                    c.base_keys, c.base_values = n.keys[..., :p, :], n.values[..., :p, :]
            e.split_of = (new, p)

    def _split_from(self, new: LiveEntry, old: LiveEntry, p: int, source_root, known: int,
                    source) -> None:
        """`new`'s global layers held as `old`'s first `p` tokens and its own after them
        (`SplitKV`), where equal bit for bit there: siblings of one prefix (a fork, a
        regenerated answer, a rewind) keep one copy of it instead of one each. Compared from
        where it is known equal: the source `new` continued (its first `known` tokens), or,
        both canonical through p, the last block boundary before p (as `_share_prefixes`)."""
        if any(e.differs.get(id(old), p + 1) <= p for e in _chain(new)):
            return  # found to differ where both hold
        check_from = self._known_equal(new, old, p, source, source_root, known)
        if source is not None and source.split_of is not None:  # (a fork's answer: its
            base, q = source.split_of  # prompt's entry was split from `old` already)
            if base is old or _root(base) is _root(old):
                check_from = max(check_from, min(q, known, p))
        globals_ = [i for i, c in enumerate(new.cache)
                    if _kinds.kind_of(c) is _GLOBAL and c.keys is not None]
        views = {i: _sibling_prefix(new.cache[i], old.cache[i], p) for i in globals_}
        if not globals_ or any(v is None for v in views.values()):
            return  # (all or none: the prefix is one, not a layer's)
        a = check_from
        pairs = [pair for i, (k, v) in views.items() for pair in (
            (k[..., a:, :], new.cache[i].keys[..., a:p, :]),
            (v[..., a:, :], new.cache[i].values[..., a:p, :]))]
        if a < p and not same_bits(pairs):
            new.differs[id(old)] = min(p, new.differs.get(id(old), p))
            return
        cache = list(new.cache)  # (a new list: the request may still run the one it gave)
        for i, (k, v) in views.items():
            cache[i] = SplitKV(cache[i], k, v, p)
        new.cache, new.split_of = cache, (_root(old), p)  # (equal to old's root there too)
        self.stats.split += 1

    def shrink_to(self, limit: int) -> None:
        """Evict least recently used entries until the pool holds at most `limit` bytes (the
        RAM budget's pressure)."""
        self._trim(limit)

    def _trim(self, limit: int | None = None) -> None:
        limit = self.budget_bytes if limit is None else min(limit, self.budget_bytes)
        while self.entries and (self.nbytes > limit or len(self.entries) > self.max_entries):
            _, entry = self.entries.popitem(last=False)
            self._leave(entry, "evicted")
        canonical = [k for k, e in self.entries.items() if e.canonical_to]
        for k in canonical[:max(0, len(canonical) - self.max_canonical)]:
            self._leave(self.entries.pop(k), "evicted")

    def _leave(self, entry: LiveEntry, why: str) -> None:
        """`entry` leaves: "evicted" or "replaced" (its record job queued), "released" (its
        subtree is gone: no job)."""
        self.nbytes -= entry.nbytes
        if why == "evicted":
            self.stats.evicted += 1
        elif why == "replaced":
            self.stats.replaced += 1
        if why != "released" and entry.on_leave is not None:
            entry.on_leave()
        entry.cache, entry.on_leave, entry.split_of = [], None, None

    def best(self, tokens: Sequence[int], tag: bytes) -> tuple[LiveEntry | None, int]:
        """The entry of namespace `tag` that gives `tokens` the longest usable prefix (always
        leaving one token to compute), and that prefix's length."""
        want_max = len(tokens) - 1
        want = tokens[:want_max]  # (once: not a copy of a deep chat's tokens per entry)
        best, best_u = None, 0
        for entry in reversed(self.entries.values()):  # most recent first: ties go to it
            if entry.tag != tag or min(len(entry.tokens), want_max) <= best_u:
                continue  # (it could share no more than the best so far: not compared)
            shared = shared_prefix(entry.tokens, want)
            if shared <= best_u:
                continue
            u = cut_limit(entry.cache, len(entry.tokens), shared)
            if u > best_u:
                best, best_u = entry, u
        return best, best_u

    def best_canonical(self, tokens: Sequence[int], tag: bytes, last_cut: Callable[[int], int]
                       ) -> tuple[LiveEntry | None, int]:
        """The exact prompt's entry of namespace `tag` that `tokens` continues furthest, and
        `last_cut(shared)` (`tokens`' last canonical cut at or before what they share, before
        their end; 0: none); (None, 0) when none."""
        best, best_u = None, 0
        for entry in reversed(self.entries.values()):
            if entry.tag != tag or not entry.canonical_to:
                continue
            tokens_of = entry.tokens  # (its first canonical_to, uncopied where that is all)
            if entry.canonical_to < len(tokens_of):
                tokens_of = tokens_of[:entry.canonical_to]
            u = last_cut(shared_prefix(tokens_of, tokens))
            if u > best_u:
                best, best_u = entry, u
        return best, best_u

    def hand_off(self, entry: LiveEntry, u: int) -> list:
        """Caches holding the first `u` tokens of an exact prompt's entry, which leaves the
        pool: its arrays move over uncopied (the kinds' `hand_over`)."""
        del self.entries[id(entry)]
        self.nbytes -= entry.nbytes
        self.stats.hits += 1
        self.stats.handed += 1
        self.stats.tokens += u
        out = [k.hand_over(c, new, u) for c, new, k in
               zip(entry.cache, self.make_cache(), _kinds_of(entry.cache))]
        entry.cache, entry.split_of = [], None
        return out

    def take(self, entry: LiveEntry, u: int) -> list:
        """New caches holding the first `u` tokens of `entry`; marks it recently used."""
        self.entries.move_to_end(id(entry))
        self.stats.hits += 1
        self.stats.tokens += u
        return cut(entry.cache, len(entry.tokens), u, self.make_cache)

    def release(self, keys) -> int:
        """Drop the entries holding any of `keys` (a released subtree); how many went."""
        keys = frozenset(keys)
        gone = [k for k, e in self.entries.items() if not e.keys.isdisjoint(keys)]
        for k in gone:
            self._leave(self.entries.pop(k), "released")
        self.stats.released += len(gone)
        return len(gone)

    def clear(self) -> None:
        for entry in self.entries.values():
            entry.cache, entry.on_leave = [], None
        self.entries.clear()
        self.nbytes = 0
