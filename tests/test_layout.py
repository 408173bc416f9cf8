import warnings

import pytest
from conftest import load_tiny
from forkv.engine import CacheKind, ForkvWarning
from forkv.engine.cache.layout import cache_layout, classify_cache

EXPECTED = {
    "qwen3": {CacheKind.GLOBAL},
    "gemma3": {CacheKind.GLOBAL, CacheKind.WINDOW},
    "gemma4": {CacheKind.GLOBAL, CacheKind.WINDOW},
    "qwen3_5": {CacheKind.GLOBAL, CacheKind.STATE},
}


def test_kinds_per_architecture(arch):
    layout = load_tiny(arch).layout
    assert layout.kinds == EXPECTED[arch]
    assert layout.can_checkpoint
    windows = [c.max_size for c in load_tiny(arch).make_cache() if hasattr(c, "max_size")]
    assert layout.max_window == max(windows, default=0)


def test_gemma3_pattern():
    layout = load_tiny("gemma3").layout
    # sliding_window_pattern=3: every third layer is global
    assert [l.kind for l in layout.layers][:3] == [CacheKind.WINDOW, CacheKind.WINDOW,
                                                   CacheKind.GLOBAL]


def test_unknown_cache_class_warns_and_disables_checkpoints():
    from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache, RotatingKVCache

    assert classify_cache(QuantizedKVCache()) is CacheKind.UNKNOWN
    assert classify_cache(RotatingKVCache(64, keep=4)) is CacheKind.UNKNOWN
    with pytest.warns(ForkvWarning, match=r"CacheList\(KVCache, QuantizedKVCache\)"):
        layout = cache_layout([KVCache(), CacheList(KVCache(), QuantizedKVCache())])
    assert not layout.can_checkpoint


def test_cache_list_children_are_leaves():
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

    layout = cache_layout([CacheList(ArraysCache(2), RotatingKVCache(100)),
                           CacheList(ArraysCache(2), KVCache())])
    assert [(l.path, l.kind) for l in layout.layers] == [
        ((0, 0), "state"), ((0, 1), "window"), ((1, 0), "state"), ((1, 1), "global")]
    assert layout.can_checkpoint and layout.max_window == 100
    assert list(layout.blocks("window", 512, 64)) == [6, 7]  # the last 99 tokens
    assert list(layout.blocks("state", 512, 64)) == [7] and layout.indices("global") == []
    assert layout.describe() == "2 state, 1 window, 1 global (window 100)"


def test_other_non_trimmable_caches_are_state():
    """A cache class no kind names, but whose state is plain arrays and numbers and which
    cannot be trimmed (deepseek_v41's LayerCache), is checkpointed as whole state."""
    import mlx.core as mx

    class Opaque:
        def __init__(self):
            self.window, self.offset, self.parts = None, 0, [None, None]

        def is_trimmable(self):
            return False

    class Trimmable(Opaque):
        def is_trimmable(self):
            return True

    assert classify_cache(Opaque()) == "state"
    assert classify_cache(Trimmable()) is CacheKind.UNKNOWN
    from forkv.engine.cache.kinds import kind_of

    live = Opaque()
    live.window, live.offset, live.parts = mx.arange(6.0), 6, [mx.ones(2), None]
    arrays = kind_of(live).snapshot(live, 256, 256)
    back = kind_of(live).rebuild(Opaque(), 256, 256, {0: arrays})
    assert back.offset == 6 and type(back.offset) is int and back.parts[1] is None
    assert mx.array_equal(back.window, live.window).item() and back.window is not live.window


def test_known_layout_does_not_warn():
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layout = cache_layout([KVCache(), RotatingKVCache(64), ArraysCache(2)])
    assert [l.kind for l in layout.layers] == [CacheKind.GLOBAL, CacheKind.WINDOW,
                                               CacheKind.STATE]


def test_chunked_caches_read_the_blocks_covering_their_chunk():
    from mlx_lm.models.cache import ChunkedKVCache, KVCache

    layout = cache_layout([ChunkedKVCache(100), KVCache()])
    assert [l.kind for l in layout.layers] == ["chunked", "global"] and layout.can_checkpoint
    # a fresh prefill to 768 keeps tokens [412, 768): blocks 1 and 2
    assert list(layout.blocks("chunked", 768, 256)) == [1, 2]
    assert list(layout.blocks("chunked", 256, 256)) == [0]
