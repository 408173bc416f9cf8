"""Cached K/V at half width and in q8_0 (engine/native/kvcache.py and the attention kernel's
narrow reads): the caches hold the format, the kernel reads it exactly, records are half (q8_0:
about a quarter of) the bytes, restores stay bit-exact, and a record made under one format
never restores under another."""

import contextlib

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
    """demo:<arch>:tiny, or `arch` as "<arch>:<size>" (q8_0 needs head_dim in whole groups of
    32: qwen3's tiny demo has 16, its small one 64)."""
    from forkv.engine import load_model

    _native()
    if (arch, kv) not in _loaded:
        name = f"demo:{arch}" if ":" in arch else f"demo:{arch}:tiny"
        _loaded[arch, kv] = load_model(name, kv_dtype=kv)
    return _loaded[arch, kv]


def _stored(kv: str):
    """The mlx dtype a cache of format `kv` holds (q8_0: uint8 rows of scales and int8s)."""
    import mlx.core as mx

    return mx.uint8 if kv == "q8_0" else getattr(mx, kv)


def _q8_reference(x):
    """q8_0 rows of float32 `x` [..., D] by numpy, as halfkv.h specifies them."""
    import numpy as np

    a = np.array(x, dtype=np.float32).reshape(-1, 32)
    d = np.minimum(np.abs(a).max(axis=1) / np.float32(127), np.float32(65504))
    d = d.astype(np.float16)
    df = d.astype(np.float32)[:, None]
    q = np.where(df > 0, np.rint(a / np.where(df > 0, df, np.float32(1))), 0)
    q = np.clip(q, -127, 127).astype(np.int8)
    rows = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)
    return rows.reshape(*x.shape[:-1], -1)


@contextlib.contextmanager
def _on_isa(lib, isa: str):
    """The kernels on `isa` inside the block (skipped where this CPU lacks it), then back."""
    order = ["scalar", "avx2", "avx512vnni"]
    if order.index(isa) > order.index(lib.best_isa()):
        pytest.skip(f"this CPU has no {isa}")
    best = lib.isa()
    lib.set_isa(isa)
    try:
        yield
    finally:
        lib.set_isa(best)


def _leaves(caches):
    return [x for c in caches for x in getattr(c, "caches", (c,))]


@pytest.mark.parametrize("arch, kv", [(a, k) for a in ("qwen3", "gemma3")
                                      for k in ("auto", "float16", "bfloat16", "float32")]
                         + [("qwen3:small", "q8_0"), ("gemma3", "q8_0")])
def test_the_cache_stores_the_format_and_batches_keep_it(arch, kv):
    import mlx.core as mx

    from forkv.engine.native import DEFAULT_KV_DTYPE

    lm = _load(arch, kv)
    want = DEFAULT_KV_DTYPE if kv == "auto" else kv
    assert lm.kv_dtype == want
    caches = lm.make_cache()
    mx.eval(lm.model(mx.array([random_tokens(40, seed=1)]), cache=caches))
    for c in _leaves(caches):
        assert c.keys.dtype == c.values.dtype == _stored(want), type(c).__name__
    merged = [type(c).merge([c]) for c in caches]  # as a decode batch joins a row
    mx.eval(lm.model(mx.array([[3]]), cache=merged))
    row = [c.extract(0) for c in merged]
    for c in _leaves(merged) + _leaves(row):
        assert c.keys.dtype == _stored(want), type(c).__name__


def test_q8_falls_back_to_float16_where_head_dim_is_not_whole_groups(caplog):
    with caplog.at_level("WARNING"):
        lm = _load("qwen3", "q8_0")  # head_dim 16
    assert lm.kv_dtype == "float16"
    assert "multiple of 32" in caplog.text and "[16]" in caplog.text


@pytest.mark.parametrize("isa", ["avx512vnni", "avx2", "scalar"])
@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_the_kernel_reads_half_kv_as_their_float32_values(isa, kv):
    import mlx.core as mx

    lib = _native()
    dt = getattr(mx, kv)
    mx.random.seed(3)
    with _on_isa(lib, isa):
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


@pytest.mark.parametrize("isa", ["avx512vnni", "avx2", "scalar"])
def test_the_kernel_reads_q8_kv_as_their_dequantized_values(isa):
    import mlx.core as mx

    from forkv.engine.native.kvcache import dequantize_q8

    lib = _native()
    mx.random.seed(5)
    with _on_isa(lib, isa):
        for B, Hq, Hkv, L, S, D in [(1, 4, 1, 1, 700, 256), (2, 6, 3, 1, 300, 64),
                                    (1, 4, 2, 37, 600, 128)]:
            q = mx.random.normal((B, Hq, L, D))
            kf, vf = mx.random.normal((B, Hkv, S, D)) * 4, mx.random.normal((B, Hkv, S, D))
            k, v = lib.quantize_kv(kf), lib.quantize_kv(vf)
            assert k.dtype == mx.uint8 and k.shape == (B, Hkv, S, D // 32 * 34)
            assert (k == mx.array(_q8_reference(kf))).all().item()
            # a row's bytes do not depend on the call it is quantized in
            assert mx.array_equal(lib.quantize_kv(kf[:, :, 5:9]), k[:, :, 5:9]).item()
            got = lib.attention(q, k, v, 0.125, None, L > 1)
            want = lib.attention(q, dequantize_q8(k), dequantize_q8(v), 0.125, None, L > 1)
            assert mx.array_equal(got, want).item(), (B, Hq, Hkv, L, S, D)
            for i in (0, L - 1):  # a prefill row is the decode step over the same keys
                n = S - L + i + 1
                step = lib.attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], 0.125)
                assert mx.array_equal(step, got[:, :, i:i + 1]).item(), i
        # Groups of zeros, tiny values, values past float16's range: scale 0 means all zeros;
        # the scale caps at 65504 (q clamps at +-127).
        x = mx.array([0.0] * 32 + [1e-9] * 32 + [1e9, -3.0] * 16 + [2.0, -127.0] * 16)
        rows = lib.quantize_kv(x.reshape(1, 1, 1, 128))
        assert (rows == mx.array(_q8_reference(x.reshape(1, 1, 1, 128)))).all().item()
        back = dequantize_q8(rows).reshape(-1)
        assert (back[:64] == 0).all().item() and back[64].item() == 65504.0 * 127
        assert mx.array_equal(back[96:], x[96:]).item()
        with pytest.raises(ValueError, match="multiple of 32"):
            lib.quantize_kv(mx.zeros((1, 1, 1, 48)))
        with pytest.raises(ValueError, match="q8_0"):
            lib.attention(mx.zeros((1, 1, 1, 64)), k[:, :1, :, :34], v[:, :1, :, :34], 1.0)


@pytest.mark.parametrize("kv", ["float16", "q8_0"])
@pytest.mark.parametrize("B, Hkv, L, S", [(1, 1, 3, 700), (2, 2, 40, 300), (1, 1, 300, 812)])
def test_chunk_rows_over_narrow_kv_are_the_float32_paths_and_decode_steps(kv, B, Hkv, L, S):
    # A chunk's rows go in groups that widen each block's keys once (the union of the rows'
    # blocks, which end at each row's own position); with a causal or a window mask every
    # row gives the float32 path's bits on the widened values and a decode step's.
    import mlx.core as mx

    from forkv.engine.native.kvcache import dequantize_q8

    lib = _native()
    D, Hq = 64, 4 * Hkv
    mx.random.seed(L)
    q = mx.random.normal((B, Hq, L, D))
    kf, vf = mx.random.normal((B, Hkv, S, D)), mx.random.normal((B, Hkv, S, D))
    if kv == "q8_0":
        k, v = lib.quantize_kv(kf), lib.quantize_kv(vf)
        wk, wv = dequantize_q8(k), dequantize_q8(v)
    else:
        k, v = kf.astype(mx.float16), vf.astype(mx.float16)
        wk, wv = k.astype(mx.float32), v.astype(mx.float32)
    rows, cols = mx.arange(S - L, S)[:, None], mx.arange(S)[None]
    window = (cols <= rows) & (cols > rows - 300)
    causal = lib.attention(q, k, v, 0.125, None, True)
    assert mx.array_equal(causal, lib.attention(q, wk, wv, 0.125, None, True)).item()
    assert mx.array_equal(lib.attention(q, k, v, 0.125, window),
                          lib.attention(q, wk, wv, 0.125, window)).item()
    for i in {0, L // 2, L - 1}:
        n = S - L + i + 1
        step = lib.attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], 0.125)
        assert mx.array_equal(step, causal[:, :, i:i + 1]).item(), i


def _engine(lm, store=None, block=256):
    store = store or RecordStore(1 << 30, None)
    return scoped_engine(lm, block_size=block, store=store), store


@pytest.mark.parametrize("arch, kv", [
    ("qwen3", "float16"), ("gemma3", "float16"), ("gemma3", "q8_0"),
    pytest.param("qwen3:small", "q8_0", marks=pytest.mark.slow),
    pytest.param("qwen3", "bfloat16", marks=pytest.mark.slow),
    pytest.param("gemma3", "bfloat16", marks=pytest.mark.slow)])
def test_restore_is_bit_exact_in_the_narrow_format(arch, kv):
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
            assert c.keys.dtype == _stored(kv)


@pytest.mark.parametrize("arch, formats", [
    ("qwen3", ("float32", "float16", "bfloat16")),  # (head_dim 16: no q8_0)
    ("gemma3", ("float32", "float16", "bfloat16", "q8_0")),
    pytest.param("qwen3:small", ("float32", "q8_0"), marks=pytest.mark.slow)])
def test_records_take_half_the_bytes_and_q8_about_a_quarter(arch, formats):
    sizes = {}
    for kv in formats:
        engine, store = _engine(_load(arch, kv))
        engine.generate(random_tokens(600, seed=5), max_tokens=1)
        engine.drain()
        sizes[kv] = store.stats.bytes_put
    assert sizes["float32"] > 0
    # the records hold K/V (and a few small int arrays): half the bytes, within 2%; q8_0 34
    # bytes for every 32 values
    for kv, share in (("float16", 0.5), ("bfloat16", 0.5), ("q8_0", 34 / 128)):
        if kv in sizes:
            assert abs(sizes[kv] / sizes["float32"] - share) < 0.02, sizes


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
    q8 = _load("gemma3", "q8_0")
    assert q8.fingerprint != _load("gemma3", "float16").fingerprint
    third, _ = _engine(q8, store)
    assert third.generate(prompt, max_tokens=1).timings.reused_tokens == 0


def test_the_setting_reads_the_environment_and_is_checked():
    from forkv.engine import EngineConfig
    from forkv.engine.config import EngineConfigError

    assert EngineConfig.from_env({}).kv_dtype == "auto"
    assert EngineConfig.from_env({"FORKV_KV_DTYPE": "bfloat16"}).kv_dtype == "bfloat16"
    assert EngineConfig.from_env({"FORKV_KV_DTYPE": "bfloat16"},
                                 kv_dtype="float32").kv_dtype == "float32"
    assert EngineConfig.from_env({"FORKV_KV_DTYPE": "q8_0"}).kv_dtype == "q8_0"
    with pytest.raises(EngineConfigError, match="kv_dtype"):
        EngineConfig.from_env({}, kv_dtype="int8")


def test_kv_bits_is_kv_dtype_by_width():
    import argparse

    from forkv.cli import add_kv_dtype_option

    p = argparse.ArgumentParser()
    add_kv_dtype_option(p)
    assert p.parse_args(["--kv-bits", "8"]).kv_dtype == "q8_0"
    assert p.parse_args(["--kv-bits", "16"]).kv_dtype == "float16"
    assert p.parse_args(["--kv-dtype", "q8_0"]).kv_dtype == "q8_0"
    assert p.parse_args([]).kv_dtype is None
    for bad in (["--kv-bits", "4"], ["--kv-bits", "8", "--kv-dtype", "float16"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_half_kv_perplexity_is_within_bounds_on_real_models(model):
    """A 2,048-token passage (Python's language reference): float16 K/V within 0.5% of
    float32's perplexity, bfloat16 and q8_0 within 1% (docs/memory.md has the full run)."""
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
    assert h["q8_0_ppl_vs_float32"] <= 1.01, h
    assert {c["kv_dtype"] for c in out["cases"]} == {"float16", "bfloat16", "q8_0", "float32"}
