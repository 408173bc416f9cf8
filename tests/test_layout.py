import warnings

import pytest

from conftest import load_tiny
from forkv.engine import CacheKind, ForkvWarning
from forkv.engine.layout import cache_layout, classify_cache

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
    if CacheKind.WINDOW in layout.kinds:
        assert layout.max_window == 128


def test_gemma3_pattern():
    layout = load_tiny("gemma3").layout
    # sliding_window_pattern=3: every third layer is global
    assert [l.kind for l in layout.layers][:3] == [CacheKind.WINDOW, CacheKind.WINDOW,
                                                   CacheKind.GLOBAL]


def test_unknown_cache_class_warns_and_disables_checkpoints():
    from mlx_lm.models.cache import ChunkedKVCache, KVCache, QuantizedKVCache

    assert classify_cache(QuantizedKVCache()) is CacheKind.UNKNOWN
    with pytest.warns(ForkvWarning, match="ChunkedKVCache"):
        layout = cache_layout([KVCache(), ChunkedKVCache(64)])
    assert not layout.can_checkpoint


def test_known_layout_does_not_warn():
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layout = cache_layout([KVCache(), RotatingKVCache(64), ArraysCache(2)])
    assert [l.kind for l in layout.layers] == [CacheKind.GLOBAL, CacheKind.WINDOW,
                                               CacheKind.STATE]
