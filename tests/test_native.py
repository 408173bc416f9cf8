"""forkv's CPU kernels (engine/native): built here, exact to their own arithmetic on every ISA,
row-independent (a row's result never depends on the rows beside it), and wired into loading:
quantized layers move onto them, their scales stay float32 and the fingerprint names them."""

from __future__ import annotations

import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from forkv.engine import native

ISAS = ("avx512vnni", "avx2", "scalar")


@pytest.fixture(scope="module")
def lib():
    module = native.load()
    if module is None:
        if shutil.which("cmake") and shutil.which("c++"):
            pytest.fail(f"the kernels should build on this machine: {native.status().reason}")
        pytest.skip(f"forkv's kernels are not available: {native.status().reason}")
    yield module
    module.set_isa(module.best_isa())


def _isas(lib):
    order = ISAS[ISAS.index(lib.best_isa()):]
    return order


def _kernel_weight(lib, w, K, bits):
    return lib.repack(w, K, bits) if bits in (5, 6) else w


def _reference(x, w, s, b, bits, g):
    """What the kernels compute, in float64: x rounded to int8 per 32-block (half to even)
    times the dequantized weights, plus the biases times the float sums of x."""
    x = np.array(x, np.float32)
    M, K = x.shape
    blocks = x.reshape(M, K // 32, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), 0)
    xq = (np.rint(blocks * inv.astype(np.float32)) * (amax / np.float32(127)))
    xq = xq.reshape(M, K).astype(np.float64)
    biases = np.repeat(np.array(b, np.float64), g, axis=1)
    wd = np.array(mx.dequantize(w, s, b, group_size=g, bits=bits), np.float64)
    return xq @ (wd - biases).T + x.astype(np.float64) @ biases.T


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_kernels_compute_their_arithmetic_on_every_isa(lib, bits, group_size):
    N, K, M = 37, 256, 6
    w, s, b = mx.quantize(mx.random.normal((N, K), key=mx.random.key(bits)),
                          group_size=group_size, bits=bits)
    x = mx.random.normal((M, K), key=mx.random.key(group_size))
    ref = _reference(x, w, s, b, bits, group_size)
    for isa in _isas(lib):
        lib.set_isa(isa)
        y = np.array(lib.quantized_matmul(x, _kernel_weight(lib, w, K, bits), s, b, bits,
                                          group_size), np.float64)
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max(), (isa, bits, group_size)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(lib, bits):
    # The exactness contract under the kernels: prefill chunked differently, or batched with
    # other sequences, gives every row the same bits.
    N, K, M = 70, 640, 23
    w, s, b = mx.quantize(mx.random.normal((N, K)), group_size=32, bits=bits)
    s, b = s.astype(mx.float32), b.astype(mx.float32)
    wk = _kernel_weight(lib, w, K, bits)
    x = mx.random.normal((M, K))
    for isa in _isas(lib):
        lib.set_isa(isa)
        whole = lib.quantized_matmul(x, wk, s, b, bits, 32)
        parts = mx.concatenate([lib.quantized_matmul(x[i:j], wk, s, b, bits, 32)
                                for i, j in ((0, 1), (1, 6), (6, 7), (7, 23))])
        assert mx.array_equal(whole, parts).item(), isa
        lib.set_num_threads(1)
        try:
            assert mx.array_equal(whole, lib.quantized_matmul(x, wk, s, b, bits, 32)).item()
        finally:
            lib.set_num_threads(0)


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
    with pytest.raises(ValueError, match="unknown ISA"):
        lib.set_isa("sse9")


def _quantized_mlp(bits: int):
    model = nn.Sequential(nn.Embedding(64, 128), nn.Linear(128, 192), nn.Linear(192, 128, bias=False))
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


def test_unsupported_layers_are_named():
    from forkv.engine.native.layers import unsupported

    model = nn.Sequential(nn.Linear(96, 32))
    nn.quantize(model, group_size=32, bits=3)
    assert unsupported(model) == ["layers.0: 3-bit"]
    odd = nn.Sequential(nn.Linear(96, 32))
    nn.quantize(odd, group_size=32, bits=4)
    assert unsupported(odd) == ["layers.0: input size 96 (not a multiple of 64)"]


def test_loading_a_quantized_model_uses_the_kernels_and_names_them(lib, tmp_path, monkeypatch):
    from mlx_lm.utils import save_model

    from forkv.engine import load_model
    from forkv.engine.sources import resolve_source

    src = resolve_source("demo:qwen3:tiny").path
    folder = tmp_path / "q4"
    shutil.copytree(src, folder)
    lm = load_model(str(src))
    nn.quantize(lm.model, group_size=64, bits=4)
    config = dict(lm.config, quantization={"group_size": 64, "bits": 4})
    for f in folder.glob("*.safetensors"):
        f.unlink()
    save_model(folder, lm.model)
    import json

    (folder / "config.json").write_text(json.dumps(config))
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


def test_status_says_why_when_turned_off(monkeypatch):
    monkeypatch.setenv("FORKV_NATIVE", "off")
    monkeypatch.setattr(native, "_info", None)
    monkeypatch.setattr(native, "_module", None)
    assert native.load() is None
    assert native.status().reason == "turned off (FORKV_NATIVE=off)"
    assert native.kernel_label() == ""
    from forkv.doctor import kernels_line

    assert "FORKV_NATIVE=off" in kernels_line(True)
