import pytest

from conftest import TOLERANCE_KV, load_tiny
from forkv.engine.request.generate import chunk_ends, prefill


def test_chunk_ends_are_block_aligned():
    assert chunk_ends(0, 600, 256) == [256, 512, 600]
    assert chunk_ends(256, 512, 256) == [512]
    assert chunk_ends(300, 301, 256) == [301]
    assert chunk_ends(100, 700, 256) == [256, 512, 700]


def _tokens(n, seed=0):
    import random

    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def test_chunked_prefill_matches_single_shot(arch):
    import mlx.core as mx
    import numpy as np

    lm = load_tiny(arch, kv_dtype=TOLERANCE_KV)  # (conftest: two chunkings compared)
    tokens = _tokens(700)
    chunked = prefill(lm.model, lm.make_cache(), tokens, 0, 256)
    single = lm.model(mx.array(tokens)[None], cache=lm.make_cache())[0, -1]
    np.testing.assert_allclose(np.array(chunked), np.array(single), atol=2e-4, rtol=1e-4)


def test_boundary_hook_sees_every_boundary():
    lm = load_tiny("gemma3")
    seen = []
    prefill(lm.model, lm.make_cache(), _tokens(800), 0, 256,
            lambda pos, toks, cache, in_decode: seen.append((pos, len(toks), cache[0].offset)))
    assert seen == [(256, 256, 256), (512, 512, 512), (768, 768, 768)]


def test_prefill_needs_a_new_token():
    lm = load_tiny("qwen3")
    with pytest.raises(AssertionError):
        prefill(lm.model, lm.make_cache(), [1, 2], 2, 256)
