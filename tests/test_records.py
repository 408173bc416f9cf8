import pytest
from conftest import load_tiny
from forkv.engine.cache.layout import CacheKind, cache_layout
from forkv.engine.cache.records import rebuild, snapshot, window_blocks, window_tail
from forkv.engine.request.generate import prefill
from helpers import fresh_logits, random_tokens


def test_window_tail_and_blocks():
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    assert window_tail(128, 256) == 127 and window_tail(512, 256) == 256
    layout = cache_layout([RotatingKVCache(128), KVCache()])
    assert list(window_blocks(layout, 1024, 256)) == [3]
    assert list(window_blocks(layout, 1024, 64)) == [14, 15]


def _records_at(lm, tokens, B):
    records = {}

    def hook(pos, toks, cache, in_decode):
        for r in snapshot(cache, lm.layout, pos, B, toks, set(lm.layout.kinds)):
            records[(r.block, r.kind)] = r

    prefill(lm.model, lm.make_cache(), tokens, 0, B, hook)
    return records


# Small blocks cross many boundaries: the longest case of the fast suite, so it runs with --slow.
@pytest.mark.parametrize("B", [pytest.param(64, marks=pytest.mark.slow), 256])
def test_rebuild_gives_identical_logits(arch, B):
    import mlx.core as mx

    lm = load_tiny(arch)
    tokens = random_tokens(4 * 256 + 20, seed=3)
    records = _records_at(lm, tokens, B)
    fresh = fresh_logits(lm, tokens, B)  # the reference, once for every restore point
    for n in (B, 3 * B, 4 * 256):
        need = {kind: {b: records[(b, kind)] for b in lm.layout.blocks(kind, n, B)}
                for kind in lm.layout.kinds}
        cache = rebuild(lm.make_cache(), lm.layout, n, B, need)
        got = prefill(lm.model, cache, tokens, n, B)
        assert mx.array_equal(got, fresh).item(), (arch, B, n)


def test_snapshots_are_copies_not_views():
    """A snapshot must not change when the live cache keeps running (seen: a by-reference
    gated-delta snapshot gave logit errors of about 3.0)."""
    import mlx.core as mx

    lm = load_tiny("qwen3_5")
    tokens = random_tokens(600, seed=5)
    cache = lm.make_cache()
    prefill(lm.model, cache, tokens[:256], 0, 256)
    records = snapshot(cache, lm.layout, 256, 256, tokens, set(lm.layout.kinds))
    before = {r.kind: {k: mx.array(v) for k, v in r.arrays.items()} for r in records}
    prefill(lm.model, cache, tokens, 256, 256)
    for r in records:
        for name, arr in r.arrays.items():
            assert mx.array_equal(arr, before[r.kind][name]).item(), name


def test_record_kinds_per_layout():
    lm = load_tiny("gemma3")
    records = _records_at(lm, random_tokens(300), 256)
    assert {kind for _, kind in records} == {CacheKind.GLOBAL, CacheKind.WINDOW}
    w = records[(0, CacheKind.WINDOW)]
    assert all(a.shape[2] == lm.layout.max_window - 1 for a in w.arrays.values())
    g = records[(0, CacheKind.GLOBAL)]
    assert all(a.shape[2] == 256 for a in g.arrays.values())


def _caches():
    """One of each cache class the kinds serve, as mlx-lm makes them."""
    from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

    return [KVCache(), RotatingKVCache(8), ArraysCache(2), ChunkedKVCache(8),
            CacheList(KVCache(), ArraysCache(1))]


def _feed(cache, n: int, seed: int):
    """Run `n` tokens of random K/V (and recurrent state) through `cache`; what it returns."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, CacheList

    mx.random.seed(seed)
    if isinstance(cache, CacheList):
        return [_feed(c, n, seed + j) for j, c in enumerate(cache.caches)]
    if isinstance(cache, ArraysCache):
        for j in range(len(cache.cache)):
            old = cache.cache[j] if cache.cache[j] is not None else 0
            cache.cache[j] = old + mx.random.normal((1, 2, 3))
        return list(cache.cache)
    kv = mx.random.normal((1, 2, n, 4)), mx.random.normal((1, 2, n, 4))
    if hasattr(cache, "maybe_trim_front"):
        cache.maybe_trim_front()  # (what a chunked layer does before each pass)
    return list(cache.update_and_fetch(*kv))


def _flat(x) -> list:
    """The arrays in `x` (nested lists and tuples), in order."""
    import mlx.core as mx

    return [a for y in x for a in (_flat(y) if isinstance(y, (list, tuple)) else [y])
            if isinstance(a, mx.array)]


def test_a_whole_copy_is_the_same_cache_and_shares_nothing():
    """save_whole / load_whole (checkpoints inside a block, live-cache copies) give a cache
    that computes what the original does, for every cache class, composites too, and that
    runs on without touching the original."""
    import mlx.core as mx
    from forkv.engine.cache import kinds

    for cache, fresh in zip(_caches(), _caches()):
        _feed(cache, 11, seed=1)  # past the ring and the chunk: wrapped, trimmed
        kind = kinds.kind_of(cache)
        copy = kind.load_whole(fresh, kind.save_whole(cache))
        before = [mx.array(a) for a in _flat(cache.state)]
        got = _feed(copy, 3, seed=2)
        after = _flat(cache.state)
        assert all(mx.array_equal(a, b).item() for a, b in zip(after, before, strict=True))
        want = _feed(cache, 3, seed=2)
        assert all(mx.array_equal(a, b).item()
                   for a, b in zip(_flat(got), _flat(want), strict=True)), type(cache)
