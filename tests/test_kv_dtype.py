"""Cached K/V at half width (engine/native/kvcache.py and the attention kernel's half reads):
the caches hold the format, the kernel reads it exactly, records are half the bytes, restores
stay bit-exact, and a record made under one format never restores under another."""

import pytest
from conftest import scoped_engine
from helpers import fresh_logits, random_tokens

from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request.generate import prefill

_loaded: dict = {}


def _native():
    from forkv.engine import native

    lib = native.load()
    if lib is None:
        pytest.skip(f"forkv's kernels are not in use: {native.status().reason}")
    return lib


def _load(arch: str, kv: str):
    from forkv.engine import load_model

    _native()
    if (arch, kv) not in _loaded:
        _loaded[arch, kv] = load_model(f"demo:{arch}:tiny", kv_dtype=kv)
    return _loaded[arch, kv]


def _leaves(caches):
    return [x for c in caches for x in getattr(c, "caches", (c,))]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("kv", ["auto", "float16", "bfloat16", "float32"])
def test_the_cache_stores_the_format_and_batches_keep_it(arch, kv):
    import mlx.core as mx

    from forkv.engine.native import DEFAULT_KV_DTYPE

    lm = _load(arch, kv)
    want = DEFAULT_KV_DTYPE if kv == "auto" else kv
    assert lm.kv_dtype == want
    caches = lm.make_cache()
    mx.eval(lm.model(mx.array([random_tokens(40, seed=1)]), cache=caches))
    for c in _leaves(caches):
        assert c.keys.dtype == c.values.dtype == getattr(mx, want), type(c).__name__
    merged = [type(c).merge([c]) for c in caches]  # as a decode batch joins a row
    mx.eval(lm.model(mx.array([[3]]), cache=merged))
    row = [c.extract(0) for c in merged]
    for c in _leaves(merged) + _leaves(row):
        assert c.keys.dtype == getattr(mx, want), type(c).__name__


@pytest.mark.parametrize("isa", ["avx512vnni", "avx2", "scalar"])
@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_the_kernel_reads_half_kv_as_their_float32_values(isa, kv):
    import mlx.core as mx

    lib = _native()
    best = lib.isa()
    if ["scalar", "avx2", "avx512vnni"].index(isa) > ["scalar", "avx2",
                                                      "avx512vnni"].index(lib.best_isa()):
        pytest.skip(f"this CPU has no {isa}")
    dt = getattr(mx, kv)
    mx.random.seed(3)
    try:
        lib.set_isa(isa)
        for B, Hq, Hkv, L, S, D in [(1, 4, 1, 1, 700, 256), (2, 6, 3, 1, 300, 64),
                                    (1, 4, 2, 37, 600, 128)]:
            q = mx.random.normal((B, Hq, L, D))
            k = (mx.random.normal((B, Hkv, S, D)) * 4).astype(dt)
            v = mx.random.normal((B, Hkv, S, D)).astype(dt)
            got = lib.attention(q, k, v, 0.125, None, L > 1)
            want = lib.attention(q, k.astype(mx.float32), v.astype(mx.float32), 0.125, None,
                                 L > 1)
            assert mx.array_equal(got, want).item(), (B, Hq, Hkv, L, S, D)
            for i in (0, L - 1):  # a prefill row is the decode step over the same keys
                n = S - L + i + 1
                step = lib.attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], 0.125)
                assert mx.array_equal(step, got[:, :, i:i + 1]).item(), i
        # One key: the output is V itself, so every widened value shows (subnormals, zeros,
        # the largest finite values).
        special = [0.0, -0.0, 1.0, -2.5, 6.1e-5, 5.96e-8, 3.0e-6, 65504.0, -65504.0, 1e-3]
        vals = mx.array((special * 7)[:64], dt).reshape(1, 1, 1, 64)
        out = lib.attention(mx.ones((1, 1, 1, 64)), vals, vals, 1.0, None, False)
        assert mx.array_equal(out, vals.astype(mx.float32)).item()
    finally:
        lib.set_isa(best)


def _engine(lm, store=None, block=256):
    store = store or RecordStore(1 << 30, None)
    return scoped_engine(lm, block_size=block, store=store), store


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("kv", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_restore_is_bit_exact_in_the_half_format(arch, kv):
    import mlx.core as mx

    lm = _load(arch, kv)
    engine, _ = _engine(lm)
    prompt = random_tokens(700, seed=4)
    out = engine.generate(prompt, max_tokens=8)
    engine.drain()
    for cut in (256, 512):
        tokens = (prompt + out.token_ids)[:cut] + random_tokens(30, seed=cut)
        r = engine.checkpointer.restore(tokens)
        assert r.position == cut
        got = prefill(lm.model, r.cache, tokens, r.position, 256)
        assert mx.array_equal(got, fresh_logits(lm, tokens)).item(), (arch, kv, cut)
        for c in _leaves(r.cache):
            assert c.keys.dtype == getattr(mx, kv)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_records_take_half_the_bytes(arch):
    sizes = {}
    for kv in ("float32", "float16", "bfloat16"):
        engine, store = _engine(_load(arch, kv))
        engine.generate(random_tokens(600, seed=5), max_tokens=1)
        engine.drain()
        sizes[kv] = store.stats.bytes_put
    assert sizes["float32"] > 0
    # the records hold K/V (and a few small int arrays): half the bytes, within 2%
    for kv in ("float16", "bfloat16"):
        assert abs(sizes[kv] / sizes["float32"] - 0.5) < 0.02, sizes


def test_a_record_never_restores_under_another_format():
    f32, f16 = _load("qwen3", "float32"), _load("qwen3", "float16")
    assert f32.fingerprint != f16.fingerprint != _load("qwen3", "bfloat16").fingerprint
    store = RecordStore(1 << 30, None)
    first, _ = _engine(f32, store)
    prompt = random_tokens(600, seed=6)
    first.generate(prompt, max_tokens=1)
    first.drain()
    assert first.generate(prompt, max_tokens=1).timings.reused_tokens == 512
    second, _ = _engine(f16, store)
    assert second.generate(prompt, max_tokens=1).timings.reused_tokens == 0


def test_the_setting_reads_the_environment_and_is_checked():
    from forkv.engine import EngineConfig
    from forkv.engine.config import EngineConfigError

    assert EngineConfig.from_env({}).kv_dtype == "auto"
    assert EngineConfig.from_env({"FORKV_KV_DTYPE": "bfloat16"}).kv_dtype == "bfloat16"
    assert EngineConfig.from_env({"FORKV_KV_DTYPE": "bfloat16"},
                                 kv_dtype="float32").kv_dtype == "float32"
    with pytest.raises(EngineConfigError, match="kv_dtype"):
        EngineConfig.from_env({}, kv_dtype="int8")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_half_kv_perplexity_is_within_bounds_on_real_models(model):
    """A 2,048-token passage (Python's language reference): float16 K/V within 0.5% of
    float32's perplexity, bfloat16 within 1% (docs/memory.md has the full run)."""
    from helpers import real_model_path

    from forkv.bench.kv_dtype import run_kv_bench

    _native()
    if model == "gemma3-270m":
        real_model_path()  # skips without the gemma extra
    else:
        from forkv.engine.models.named import NAMED_MODELS

        if not NAMED_MODELS[model].is_local():
            pytest.skip(f"{model} is not downloaded here")
    out = run_kv_bench(model, reps=1, passage_tokens=2048, gen_tokens=2)
    h = out["headline"]
    assert h["float16_ppl_vs_float32"] <= 1.005, h
    assert h["bfloat16_ppl_vs_float32"] <= 1.01, h
    assert {c["kv_dtype"] for c in out["cases"]} == {"float16", "bfloat16", "float32"}
