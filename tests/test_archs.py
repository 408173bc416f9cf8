"""The breadth suite: every mlx-lm architecture whose caches are not all plain KVCache is
checkpointed, with reuse, bit-exactly (forkv.check_archs). One architecture per cache shape
runs by default; the rest are marked slow (CI runs them too)."""

import pytest
from forkv.arch_configs import CONFIGS, QUANTIZED
from forkv.check_archs import BLOCK, CUTS, PROMPT, check, installed_architectures

# window, state + MoE, CacheList(state, global), other non-trimmable state, pure state, chunked
DEFAULT = {"gemma3_text", "qwen3_next", "falcon_h1", "deepseek_v41", "mamba", "llama4"}
DEFAULT_QUANTIZED = {"qwen3_next"}


def _cases():
    for arch in sorted(CONFIGS):
        for quantize in (False, True) if arch in QUANTIZED else (False,):
            fast = arch in (DEFAULT_QUANTIZED if quantize else DEFAULT)
            yield pytest.param(arch, quantize, id=f"{arch}-{'4bit' if quantize else 'fp32'}",
                               marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize("arch, quantize", _cases())
def test_architecture_is_exact_with_reuse(arch, quantize):
    result = check(arch, quantize)
    if result.status == "skipped":  # plain mlx-lm needs Metal for it (muse_spark off a Mac)
        assert arch == "muse_spark" and "Metal" in result.reason
        pytest.skip(result.reason)
    assert result.status == "exact", result.reason
    assert result.reused == list(CUTS)  # boundaries 256 and 512 from prefill, 768 from decode
    for size in result.windows:  # windows and chunks wrap inside the prompt, off the grid
        assert size % BLOCK and size < PROMPT, (arch, size)


def test_every_installed_architecture_is_configured():
    installed = set(installed_architectures())
    # the source scan finds each kind of make_cache: own classes, CacheList, wrappers,
    # subclasses of another module's Model
    assert {"gemma3_text", "qwen3_next", "falcon_h1", "llama4", "deepseek_v41", "gemma3",
            "glm_moe_dsa", "prism_hadamard_qwen35"} <= installed
    assert installed <= set(CONFIGS), installed - set(CONFIGS)


def test_configurations_are_tiny():
    assert len(QUANTIZED) >= 2 and QUANTIZED <= set(CONFIGS)
    for arch, config in CONFIGS.items():
        text = config.get("text_config", config)
        assert text.get("hidden_size", 64) <= 64, arch
        assert text.get("num_hidden_layers", 4) <= 4, arch
        assert (config.get("vocab_size") or text["vocab_size"]) <= 256, arch


def test_rewind_baseline_trims_only_where_the_trim_lands():
    """`forkv bench rewind`'s baseline trims mlx-lm's cache only when every layer (each
    CacheList child too) gives back exactly the tokens asked; otherwise it recomputes."""
    import mlx.core as mx
    from forkv.bench.rewind import _trim_back
    from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache

    def filled(cache):
        for c in [leaf for x in cache for leaf in (getattr(x, "caches", None) or [x])]:
            for _ in range(3):  # 300 tokens in three passes, as a prefill would
                if isinstance(c, ChunkedKVCache):
                    c.maybe_trim_front()
                if isinstance(c, ArraysCache):
                    c[0] = mx.zeros((1, 4))
                else:
                    c.update_and_fetch(mx.zeros((1, 1, 100, 8)), mx.zeros((1, 1, 100, 8)))
        return cache

    assert _trim_back(filled([KVCache(), CacheList(KVCache(), KVCache())]), 120)
    assert not _trim_back(filled([KVCache(), ChunkedKVCache(64)]), 120)  # past its chunk
    assert not _trim_back(filled([KVCache(), ArraysCache(1)]), 120)
    kept = filled([KVCache(), CacheList(KVCache())])
    assert _trim_back(kept, 250) and kept[1].caches[0].offset == 250


def test_cache_list_rows_merge_into_a_batch():
    """A CacheList's kind lets mlx-lm merge its rows (left-padded): a batched step gives each
    row the logits it gets alone."""
    import mlx.core as mx

    from forkv.check_archs import build
    from forkv.engine.request.batchcache import BatchCache, merge_blocker

    lm = build("falcon_h1")  # CacheList(ArraysCache, KVCache) layers
    assert merge_blocker(lm.make_cache()) is None
    batch, alone = BatchCache(True), []
    for n in (50, 80):
        tokens = mx.array([(7 * i + n) % 256 for i in range(n)])[None]
        for target in (batch, alone):
            cache = lm.make_cache()
            lm.model(tokens, cache=cache)
            mx.eval([c.state for c in cache])
            target.add(cache) if target is batch else alone.append(cache)
    both = lm.model(mx.array([[5], [9]]), cache=batch.caches)[:, -1]
    for row, (cache, token) in enumerate(zip(alone, (5, 9))):
        one = lm.model(mx.array([[token]]), cache=cache)[0, -1]
        assert mx.allclose(both[row], one, atol=1e-5).item(), row
