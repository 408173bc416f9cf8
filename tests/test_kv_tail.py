"""A decoding row writes its K/V into its own buffer while the live pool keeps its prompt's
entry over the same buffer (engine/native/kvcache.py `own_tails`, the kernels' `kv_write`):
nothing is copied, the sharer sees none of it, a write before the row's own tokens or past the
buffer's room takes mlx's copying path, and an engine gives the very tokens and logprobs it
gives with every write copied."""

import gc

import pytest
from conftest import load_tiny
from helpers import random_tokens

from forkv.engine import Engine, SamplingParams
from forkv.engine.cache.recordstore import RecordStore


@pytest.fixture(scope="module")
def kv_lib():
    from forkv.engine import native

    lib = native.load()
    if lib is None:
        pytest.skip(f"forkv's kernels are not in use: {native.status().reason}")
    return lib


def _half_cache(n: int, cap_room: int = 0):
    """A float16 KVCache (forkv's subclass) holding n random tokens, and those tokens."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from forkv.engine.native.kvcache import half_caches

    cache = half_caches([KVCache()], "float16")[0]
    k, v = mx.random.normal((1, 2, n, 64)), mx.random.normal((1, 2, n, 64))
    cache.update_and_fetch(k, v)
    mx.eval(cache.keys, cache.values)
    return cache, k.astype(mx.float16), v.astype(mx.float16)


def test_kv_write_writes_into_the_buffer_and_checks_its_arguments(kv_lib):
    import mlx.core as mx

    buf = mx.zeros((1, 2, 4096, 64), mx.float16)
    mx.eval(buf)
    held = mx.stop_gradient(buf)  # another array over the same buffer
    upd = mx.random.normal((1, 2, 3, 64)).astype(mx.float16)
    before = mx.get_active_memory()
    out = kv_lib.kv_write(buf, upd, 100)
    mx.eval(out)
    assert mx.get_active_memory() - before < buf.nbytes // 4  # not a copy
    ref = mx.zeros((1, 2, 4096, 64), mx.float16)
    ref[..., 100:103, :] = upd
    assert mx.array_equal(out, ref).item()
    assert mx.array_equal(held[..., 100:103, :], upd).item()  # the same bytes
    strided = mx.random.normal((1, 3, 2, 64)).astype(mx.float16).transpose(0, 2, 1, 3)
    assert mx.array_equal(kv_lib.kv_write(buf, strided, 7)[..., 7:10, :], strided).item()
    for bad in [(buf, upd, 4094), (buf, upd, -1), (buf, upd.astype(mx.float32), 0),
                (buf, mx.zeros((1, 1, 3, 64), mx.float16), 0)]:
        with pytest.raises(ValueError, match="kv_write"):
            kv_lib.kv_write(*bad)


def test_an_owned_tail_is_written_in_place_and_the_sharer_keeps_its_tokens(kv_lib):
    import mlx.core as mx

    from forkv.engine.native.kvcache import own_tails

    cache, k0, v0 = _half_cache(3000)  # a buffer of 3,072 (mlx-lm's steps of 256)
    shared = (mx.stop_gradient(cache.keys), mx.stop_gradient(cache.values))  # the pool's
    own_tails([cache])
    assert cache._forkv_floor == 3000
    gc.collect()
    before = mx.get_active_memory()
    new = [mx.random.normal((1, 2, 1, 64)) for _ in range(2)]
    keys, values = cache.update_and_fetch(*new)
    mx.eval(keys, values)
    assert mx.get_active_memory() - before < cache.keys.nbytes // 4  # no copy of the buffer
    assert keys.shape[2] == 3001 and cache.offset == 3001
    assert mx.array_equal(keys[..., :3000, :], k0).item()
    assert mx.array_equal(keys[..., 3000:, :], new[0].astype(mx.float16)).item()
    assert mx.array_equal(shared[0][..., :3000, :], k0).item()  # what the sharer reads
    assert mx.array_equal(shared[1][..., :3000, :], v0).item()
    # back into the shared tokens with their very bytes (a decode boundary's recompute of a
    # block that began inside the prompt): still in place
    cache.trim(5)
    gc.collect()
    before = mx.get_active_memory()
    same = [mx.concatenate([k0[..., 2996:, :], new[0].astype(mx.float16)], axis=2),
            mx.concatenate([v0[..., 2996:, :], new[1].astype(mx.float16)], axis=2)]
    keys, _ = cache.update_and_fetch(*same)
    mx.eval(keys)
    assert mx.get_active_memory() - before < cache.keys.nbytes // 4
    assert cache.offset == 3001 and mx.array_equal(keys[..., 2996:, :], same[0]).item()
    # other bytes there: mlx copies, the sharer keeps its own
    cache.trim(10)
    redo = [mx.ones((1, 2, 4, 64)) for _ in range(2)]
    keys, _ = cache.update_and_fetch(*redo)
    mx.eval(keys)
    assert mx.array_equal(shared[0][..., :3000, :], k0).item()
    assert mx.array_equal(keys[..., 2991:2995, :], redo[0].astype(mx.float16)).item()
    # past the room: mlx-lm grows the buffer (a copy), the sharer untouched
    cache.update_and_fetch(*[mx.zeros((1, 2, 200, 64)) for _ in range(2)])
    mx.eval(cache.keys)
    assert cache.offset == 3195 and cache.keys.shape[2] >= 3195
    assert mx.array_equal(shared[0][..., :3000, :], k0).item()


def test_an_unmarked_cache_copies_as_mlx_does(kv_lib):
    import mlx.core as mx

    cache, k0, _ = _half_cache(3000)
    shared = mx.stop_gradient(cache.keys)
    keys, _ = cache.update_and_fetch(*[mx.ones((1, 2, 1, 64)) for _ in range(2)])
    mx.eval(keys)
    assert mx.array_equal(shared[..., :3001, :][..., :3000, :], k0).item()
    assert not mx.array_equal(shared[..., 3000, :], keys[..., 3000, :]).item()  # its own


def _scenario(lm, monkeypatch, in_place: bool) -> list:
    """A prompt decoded past a block boundary (greedy), a seeded fork of the prompt, the
    answer's next turn: every output."""
    from forkv.engine.request import batchcache

    marked = []
    if not in_place:
        monkeypatch.setattr(batchcache, "own_tails", lambda caches: None)
    else:
        real = batchcache.own_tails

        def spy(caches):
            real(caches)
            marked.extend(getattr(c, "_forkv_floor", None) for c in caches)

        monkeypatch.setattr(batchcache, "own_tails", spy)
    engine = Engine(lm, store=RecordStore(1 << 30, None), reuse="fast")
    prompt = random_tokens(700, seed=50)
    outs = []
    try:
        greedy = SamplingParams(max_tokens=90, temperature=0, top_logprobs=2)
        outs.append(engine.generate(prompt, greedy))  # 700 + 90 crosses 768
        outs.append(engine.generate(prompt[:650] + random_tokens(20, seed=51),
                                    SamplingParams(max_tokens=40, temperature=0.8, seed=3)))
        nxt = prompt + outs[0].token_ids[:-1] + random_tokens(30, seed=52)
        outs.append(engine.generate(nxt, greedy))
        assert not in_place or 700 in marked  # (the prompt's row owned its tail)
        return [(o.token_ids, o.logprobs, o.top_logprobs, o.timings.reused_tokens)
                for o in outs]
    finally:
        monkeypatch.undo()
        engine.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_in_place_tails_change_no_token_or_logprob(arch, monkeypatch, kv_lib):
    lm = load_tiny(arch)
    copied = _scenario(lm, monkeypatch, in_place=False)
    written = _scenario(lm, monkeypatch, in_place=True)
    assert written == copied and copied[2][3] > 700  # (the next turn continued the answer)
