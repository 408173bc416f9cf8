"""The `RecordKind` interface and the registry that finds the kind of a cache by its class.

A kind is one class per mlx-lm cache class. It knows how to copy one cache's state at a block
boundary into named arrays (`snapshot`), which blocks' records a restore at boundary n reads
(`blocks`), how to fill a fresh cache from them (`rebuild`), how its records rank for eviction
and which tier they go to, and whether mlx-lm can merge its caches into a batch. It also holds
the cache surgery of checkpoints inside a block and of live caches: a whole copy in and out
(`save_whole` / `load_whole`), how far back a cache can be cut (`can_cut`, `cut`), and, for
sliding windows, the ring a cache holds and how to widen it (`ring`, `widen`). Kinds are
looked up by the exact class of a cache (a subclass may store tokens differently, and a wrong
guess would give wrong logits). Knows nothing about keys, stores or models.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import ClassVar

_BY_CLASS: dict[str, type[RecordKind]] = {}  # "module.QualName" of a cache class -> its kind
_FALLBACKS: list[type[RecordKind]] = []  # tried in order for classes no kind names
_BY_NAME: dict[str, type[RecordKind]] = {}  # record kind name -> first kind registered for it

# A record that is no layer's cache: model state kept outside the caches at a boundary
# (vision models' M-RoPE position offset). Ranked and stored like a state record.
EXTRA = "extra"
_EXTRA_RANK = 1


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def from_mlx_lm(cache) -> bool:
    """Whether `cache` is mlx-lm's own class (whose batch caches forkv merges rows with)."""
    return type(cache).__module__.startswith("mlx_lm.")


_SHARE = contextvars.ContextVar("forkv_share_arrays", default=False)


def copy_array(x):
    """A real copy (a slice or the array itself would keep its whole buffer alive); inside
    `sharing()`, a new array object reading the same buffer."""
    import mlx.core as mx

    if _SHARE.get():
        # A new object, never `x` itself: a cache's update assigns into its array object
        # (`keys[..., i, :] = k`), which another cache holding that object would see.
        return mx.stop_gradient(x)
    return mx.array(x)


@contextlib.contextmanager
def sharing():
    """`save_whole` / `load_whole` hand the cache's own arrays over instead of copies: mlx
    arrays are values (a cache's update makes a new array; a buffer another array still reads
    is never written in place), so two caches may start from the same arrays and each pays
    for its own copy only when it writes (live.share)."""
    token = _SHARE.set(True)
    try:
        yield
    finally:
        _SHARE.reset(token)


def number(x) -> object:
    """A number as a 0-d array (records hold arrays only)."""
    import mlx.core as mx

    return mx.array(x)


def save_kv(cache, n: int | None = None, **ints: str) -> dict:
    """`save_whole` of a K/V cache: copies of its keys and values (their first `n` positions,
    else all of them) and its integer attributes, `ints` mapping record name -> attribute."""
    if cache.keys is None:
        return {}
    keys, values = (cache.keys, cache.values) if n is None else \
        (cache.keys[..., :n, :], cache.values[..., :n, :])
    return {"k": copy_array(keys), "v": copy_array(values),
            **{name: number(getattr(cache, attr)) for name, attr in ints.items()}}


def load_kv(cache, arrays: dict, **ints: str):
    """`load_whole` of a K/V cache from `save_kv`'s arrays (the same `ints`); returns it."""
    if arrays:
        cache.keys, cache.values = arrays["k"], arrays["v"]
        for name, attr in ints.items():
            setattr(cache, attr, int(arrays[name].item()))
    return cache


def sub_arrays(arrays: dict, prefix: str) -> dict:
    """The arrays named `prefix` + name, by name."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


class RecordKind:
    """How the caches of one mlx-lm class are checkpointed. Subclass, set the class
    attributes, override the classmethods, and decorate with `@register`."""

    name: ClassVar[str]  # the record its arrays go into: one record per (block, name)
    # "module.QualName" of each class served (mlx-vlm copies mlx-lm's classes); () for a
    # fallback, tried for classes no kind names
    cache_classes: ClassVar[tuple[str, ...]] = ()
    evict_rank: ClassVar[int] = 0  # within a block, lower ranks are evicted first
    stays_hot: ClassVar[bool] = False  # records stay in RAM; otherwise straight to the next tier
    whole_prefix: ClassVar[bool] = False  # a record is checked against the whole prefix's
    # tokens (it holds the whole state), otherwise against its block's tokens
    trims_exactly: ClassVar[bool] = False  # after decoding a block, trimming it off leaves
    # exactly the state at the block's start (so a decode boundary recomputes it in place)

    @classmethod
    def accepts(cls, cache) -> bool:
        """Whether this kind can checkpoint this instance (e.g. not a rotating cache with keep)."""
        return True

    @classmethod
    def size(cls, cache) -> int:
        """The cache's size parameter that `blocks` needs (window, chunk), 0 if none."""
        return 0

    @classmethod
    def leaves(cls, cache, path: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], object]]:
        """The (path, cache) pairs that hold records; a composite cache yields its children."""
        yield path, cache

    @classmethod
    def blocks(cls, size: int, n: int, block_size: int) -> range:
        """Blocks whose records of this kind a restore at boundary n (> 0) reads."""
        raise NotImplementedError

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        """Copies of the arrays that describe this cache at boundary `pos` (it holds pos tokens),
        by name (a name never starts with a digit: records prefix it with the cache's path)."""
        raise NotImplementedError

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        """Fill `cache` (fresh from make_cache) to hold boundary n, from this cache's arrays of
        each block in `blocks(...)`; return it (or a replacement of the same class)."""
        raise NotImplementedError

    @classmethod
    def can_merge(cls, cache) -> bool:
        """Whether mlx-lm merges these caches into a batch exactly (left padding, masks)."""
        return False

    @classmethod
    def save_whole(cls, cache) -> dict:
        """Copies of everything `cache` holds, laid out exactly as it is (a checkpoint inside
        a block, a copy of a live cache), by name as in `snapshot`."""
        raise NotImplementedError

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        """Fill `cache` (fresh from make_cache) from `save_whole`'s arrays; return it. A
        KeyError, ValueError or TypeError when they do not fit."""
        raise NotImplementedError

    @classmethod
    def can_cut(cls, cache, n_tokens: int, u: int) -> bool:
        """Whether `cache`, holding `n_tokens` tokens, can be cut back to its first `u` (a
        state that absorbed its tokens only where it stands)."""
        return u == n_tokens

    @classmethod
    def cut(cls, cache, fresh, n_tokens: int, u: int):
        """`fresh` (from make_cache) holding the first `u` tokens of `cache` (`can_cut`)."""
        assert u == n_tokens, "this cache cannot be cut back"
        return cls.load_whole(fresh, cls.save_whole(cache))

    @classmethod
    def hand_over(cls, cache, fresh, u: int):
        """`fresh` holding the first `u` tokens of `cache`, which nobody uses afterwards, with
        exactly the arrays a canonical run has there; None for kinds that cannot (their state
        at `u` is not a part of their state after it)."""
        return None

    @classmethod
    def ring(cls, cache):
        """(keys, values) of a sliding window in time order; None for other caches."""

    @classmethod
    def widen(cls, cache, fresh, ring, n_new: int):
        """A cache like `cache` whose ring also holds `ring` (its ring before the last `n_new`
        tokens), built in `fresh`; None when it gains nothing."""


def register(kind: type[RecordKind]) -> type[RecordKind]:
    """Class decorator: make `kind` the kind of its cache class (or a fallback)."""
    first = _BY_NAME.setdefault(kind.name, kind) if getattr(kind, "name", None) else None
    if first is not None and first is not kind:
        # Kinds sharing a record must agree on how that record is kept and verified.
        for trait in ("evict_rank", "stays_hot", "whole_prefix", "trims_exactly"):
            assert getattr(first, trait) == getattr(kind, trait), (kind, trait)
        assert first.blocks.__func__ is kind.blocks.__func__, (kind, "blocks")
    if not kind.cache_classes:
        _FALLBACKS.append(kind)
    for name in kind.cache_classes:
        _BY_CLASS[name] = kind
    return kind


def kind_of(cache) -> type[RecordKind] | None:
    """The kind that checkpoints `cache`, or None when no kind can."""
    kind = _BY_CLASS.get(class_name(type(cache)))
    if kind is not None:
        return kind if kind.accepts(cache) else None
    return next((k for k in _FALLBACKS if k.accepts(cache)), None)


def record_names() -> frozenset[str]:
    """Every record kind name a store may hold."""
    return frozenset(_BY_NAME) | {EXTRA}


def evict_rank(name: str) -> int:
    kind = _BY_NAME.get(name)
    return _EXTRA_RANK if kind is None else kind.evict_rank


def stays_hot(name: str) -> bool:
    kind = _BY_NAME.get(name)
    return kind is not None and kind.stays_hot


def whole_prefix(name: str) -> bool:
    kind = _BY_NAME.get(name)
    return kind is not None and kind.whole_prefix


def named(name: str) -> type[RecordKind]:
    """The first kind registered for a record name; every kind of that name shares its
    `blocks`, eviction rank, tier and verification (snapshot and rebuild may differ)."""
    return _BY_NAME[name]
