"""blocks.py and convert_gguf(quantized=True): GGUF blocks become mlx affine tensors whose
`mx.dequantize` equals gguf-py's reference dequantization (what the float conversion stores)
value for value; the folder loads in mlx-lm as QuantizedLinear / QuantizedEmbedding modules.
"""

import json
import time
import zlib
from collections import Counter

import gguf
import mlx.core as mx
import numpy as np
import pytest
from forkv.engine.models.gguf import blocks as blocks_module
from forkv.engine.models.gguf import convert_gguf, read_gguf_header
from forkv.engine.models.gguf.archs import unpermute
from forkv.engine.models.gguf.blocks import AFFINE_BITS, KERNEL_ONLY, pack, to_affine
from forkv.engine.models.gguf.header import GGML_TYPES, TensorInfo
from forkv.engine.models.loader import read_kernel_groups, read_kernel_params
from gguf.quants import dequantize as gguf_dequantize
from gguf_files import (
    CONFIGS,
    add_model_metadata,
    add_vocab,
    bpe_vocab,
    gguf_tensors,
    permute,
    random_model,
    sentencepiece_vocab,
)
from mlx import nn

TYPE_IDS = {name: i for i, (name, _, _) in GGML_TYPES.items()}
# Byte offsets of each block's f16 scale fields (d, then dmin / m where the type has one).
F16_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}
OFFSET_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q6_K")  # a bias of -2^(bits-1) d: see test_exact_...
PROMPT = [[1, 5, 17, 200, 42, 7, 99, 3, 250, 11, 64, 128]]


def random_blocks(qtype: str, rows: int, cols: int, rng, scale: float = 1.0) -> np.ndarray:
    """(rows, bytes per row) of random `qtype` blocks: random q, sub-block scales and high
    bits; the f16 fields normal * `scale` (negative half the time). A few blocks have every
    q byte 0x00 or 0xFF, so the extreme q values of each width occur."""
    _, block, block_bytes = GGML_TYPES[TYPE_IDS[qtype]]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    fields = F16_AT[qtype]
    first = max(fields) + 2 if fields[0] == 0 else 0
    raw[: n // 8, first:] = 0x00
    raw[n // 8: n // 4, first:] = 0xFF
    for at in fields:
        raw[:, at:at + 2] = (rng.standard_normal((n, 1)) * scale).astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def info_of(qtype: str, rows: int, cols: int) -> TensorInfo:
    _, block, block_bytes = GGML_TYPES[TYPE_IDS[qtype]]
    return TensorInfo("t", (rows, cols), TYPE_IDS[qtype], 0, rows * cols // block * block_bytes)


def dequantized(weight, scales, biases, bits, group_size) -> np.ndarray:
    if group_size >= 32:
        return np.array(mx.dequantize(mx.array(weight), mx.array(scales), mx.array(biases),
                                      group_size=group_size, bits=bits))
    # mlx takes no group of 16: unpack its bit stream (value i at bits [bits i, bits (i + 1)))
    stream = np.unpackbits(np.asarray(weight).view(np.uint8), axis=-1, bitorder="little")
    q = (stream.reshape(*stream.shape[:-1], -1, bits) << np.arange(bits)).sum(-1)
    s, b = (np.repeat(np.asarray(a), group_size, axis=-1) for a in (scales, biases))
    return (s * q.astype(np.float32) + b).astype(np.float32)


def assert_same_values(ours: np.ndarray, ref: np.ndarray, qtype: str) -> None:
    """Equal as float32 values, and equal in bits except for the sign of an exact zero."""
    assert ours.dtype == ref.dtype == np.float32
    assert np.array_equal(ours, ref)
    differ = ours.view(np.uint32) != ref.view(np.uint32)
    if qtype in OFFSET_TYPES:
        # gguf-py's d * (q - 8) is -0.0 for q = 8, d < 0; mlx's d * 8 + (-8 d) is +0.0.
        assert np.all(ref[differ] == 0) and np.all(np.signbit(ref[differ]))
    else:
        assert not differ.any()


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_is_mx_quantize_packing(bits):
    """A group with min 0 and max 2^bits - 1 quantizes to q = its values (scale +-1), so the
    packed words of known q can be read off mx.quantize."""
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 1 << bits, size=(5, 128)).astype(np.float32)
    values[:, ::32], values[:, 1::32] = 0, (1 << bits) - 1
    w, s, b = mx.quantize(mx.array(values), group_size=32, bits=bits)
    s, b = np.repeat(np.array(s), 32, axis=1), np.repeat(np.array(b), 32, axis=1)
    q = np.round((values - b) / s).astype(np.uint8)  # mlx may pick scale -1, bias 2^bits - 1
    assert np.array_equal(pack(q, bits), np.array(w))


@pytest.mark.parametrize("qtype", list(AFFINE_BITS))
@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_exact_against_gguf_py_dequantize(qtype, scale, monkeypatch):
    # Small chunks: several per tensor and a partial last one, as a large tensor has.
    monkeypatch.setattr(blocks_module, "_CHUNK_ELEMENTS", 3 * 256 + 32)
    rng = np.random.default_rng(zlib.crc32(f"{qtype} {scale}".encode()))
    rows, cols = 12, 768
    raw = random_blocks(qtype, rows, cols, rng, scale)
    weight, scales, biases, bits, group = to_affine(info_of(qtype, rows, cols), raw.tobytes())
    assert (bits, group) == (AFFINE_BITS[qtype], KERNEL_ONLY.get(qtype, 32))
    assert weight.dtype == np.uint32 and weight.shape == (rows, cols * bits // 32)
    assert scales.dtype == biases.dtype == np.float32 and scales.shape == (rows, cols // group)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert_same_values(dequantized(weight, scales, biases, bits, group), ref, qtype)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "F16", "BF16", "F32"])
def test_types_without_an_exact_mapping_stay_float(qtype):
    info = info_of(qtype, 4, 256)
    assert to_affine(info, bytes(info.nbytes)) is None


def test_only_matrices_are_mapped():
    info = TensorInfo("t", (256,), TYPE_IDS["Q8_0"], 0, 8 * 34)
    assert to_affine(info, bytes(info.nbytes)) is None


def test_unpermute_undoes_llamas_permutation_row_for_row():
    w = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    assert np.array_equal(unpermute(permute(w, 4), 4), w)
    # The row form: the same order moves the rows of packed words, scales and biases.
    raw = random_blocks("Q4_0", 64, 64, np.random.default_rng(1))
    q_w, q_s, q_b, bits, group = to_affine(info_of("Q4_0", 64, 64), raw.tobytes())
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    back = dequantized(unpermute(q_w, 4), unpermute(q_s, 4), unpermute(q_b, 4), bits, group)
    assert_same_values(back, unpermute(ref, 4), "Q4_0")


# A tiny model wide enough for the K-quants' 256-value super-blocks, its matrices of mixed
# types as a Q4_K_M file mixes them; Q6_K stays float for mlx, its exact groups of 16 go to the
# kernels' file.
WIDE = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 320}
MIXED = {"token_embd": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q4_K", "attn_v": "Q8_0",
         "attn_output": "Q4_1", "ffn_gate": "Q5_K", "ffn_up": "Q5_1", "ffn_down": "Q6_K",
         "output": "Q4_0"}
MAGNITUDE = {"Q8_0": 4e-4, "Q4_0": 6e-3, "Q4_1": 6e-3, "Q5_0": 3e-3, "Q5_1": 3e-3,
             "Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 2e-4}  # d giving weights of ~0.05


def write_mixed_gguf(path, arch: str, seed: int = 0) -> None:
    _, weights = random_model(arch, seed)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    add_model_metadata(writer, arch)
    add_vocab(writer, sentencepiece_vocab() if arch in ("llama", "gemma3") else bpe_vocab())
    for name, w in gguf_tensors(arch, weights).items():
        qtype = MIXED[name.split(".")[-2]] if w.ndim == 2 else "F32"
        if qtype == "F32":
            writer.add_tensor(name, w)
        else:
            raw = random_blocks(qtype, *w.shape, rng, MAGNITUDE[qtype])
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def wide_configs(monkeypatch):
    for arch in ("llama", "qwen3", "gemma3"):
        monkeypatch.setitem(CONFIGS, arch, dict(CONFIGS[arch], **WIDE))


def assert_quantized_equals_float(quant_folder, float_folder) -> Counter:
    """Every quantized triple dequantizes to the float folder's tensor; the bit widths seen."""
    q, f = mx.load(str(quant_folder / "model.safetensors")), mx.load(
        str(float_folder / "model.safetensors"))
    config = json.loads((quant_folder / "config.json").read_text())["quantization"]
    seen = Counter()
    for key in q:
        if not key.endswith(".scales"):
            continue
        module = key.removesuffix(".scales")
        bits = config[module]["bits"]
        ours = np.array(mx.dequantize(q[f"{module}.weight"], q[key], q[f"{module}.biases"],
                                      group_size=32, bits=bits))
        want = np.array(f[f"{module}.weight"])
        assert np.array_equal(ours, want), module
        seen[bits] += 1
    assert set(q) - {k for k in q if k.endswith((".scales", ".biases"))} == set(f)
    return seen


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])  # q/k permuted; tied; gemma
def test_quantized_conversion_loads_quantized_and_matches_the_float_one(
        tmp_path, wide_configs, arch):
    from mlx_lm.utils import load_model

    src = tmp_path / f"{arch}.gguf"
    write_mixed_gguf(src, arch)
    flt = convert_gguf(src, tmp_path / "float")
    qnt = convert_gguf(src, tmp_path / "quant", quantized=True)
    # Values: q/k of llama went through the row un-permutation on both sides.
    seen = assert_quantized_equals_float(qnt, flt)
    layers = CONFIGS[arch]["num_hidden_layers"]
    untied = "output.weight" in read_gguf_header(src).tensors
    assert seen == {5: 3 * layers, 4: 2 * layers + untied, 8: layers + 1}

    config = json.loads((qnt / "config.json").read_text())
    quant = config["quantization"]
    assert config["quantization_config"] == quant
    assert (quant["group_size"], quant["bits"], quant["mode"]) == (32, 5, "affine")
    assert quant["model.embed_tokens"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert quant["model.layers.1.self_attn.k_proj"]["bits"] == 4
    assert "model.layers.0.mlp.down_proj" not in quant  # Q6_K: float for mlx
    record = json.loads((qnt / "forkv_gguf.json").read_text())
    assert record["quantized"] is True
    assert record["float_tensors"]["Q6_K"] == layers
    assert record["kernel_groups"] == {"Q6_K": layers}
    groups = read_kernel_groups(qnt)  # ... and its exact groups for forkv's kernels
    assert set(groups) == {f"model.layers.{i}.mlp.down_proj" for i in range(layers)}
    for module, (w, s, b, bits, group) in groups.items():
        assert (bits, group) == (6, 16)
        assert_same_values(dequantized(np.array(w), np.array(s), np.array(b), bits, group),
                           np.array(mx.load(str(flt / "model.safetensors"))[f"{module}.weight"]),
                           "Q6_K")
    assert record["quantized_tensors"]["Q8_0"] == layers + 1

    model, _ = load_model(qnt)
    float_model, _ = load_model(flt)
    layer = model.model.layers[0]
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.model.embed_tokens.bits == 8
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear)
    assert (layer.self_attn.q_proj.bits, layer.self_attn.k_proj.bits) == (5, 4)
    assert (layer.mlp.gate_proj.bits, layer.mlp.up_proj.bits) == (5, 5)
    assert type(layer.mlp.down_proj) is nn.Linear
    if untied:
        assert isinstance(model.lm_head, nn.QuantizedLinear) and model.lm_head.bits == 4
    else:  # the logits come from the quantized embedding's as_linear
        assert not hasattr(model, "lm_head")
    ours = np.array(model(mx.array(PROMPT)))
    want = np.array(float_model(mx.array(PROMPT)))
    print(f"\n{arch}: max |quantized - float| logits {np.abs(ours - want).max():.3g} "
          f"of max |logit| {np.abs(want).max():.3g}")
    # Same weights, different arithmetic: mlx's quantized matmul sums x * q per group and
    # applies scale and bias after (s * sum(x q) + b * sum(x)), the float matmul sums
    # x * (s q + b); the roundings differ at float32's ~1e-7 relative per layer.
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # q/k rows permuted; gemma
def test_k_quants_keep_their_super_block_params_for_the_kernels(tmp_path, wide_configs, arch):
    # Q4_K (attn_k), Q5_K (ffn_gate), Q6_K (ffn_down): the file's d, dmin, sc and m beside the
    # float32 scales and biases, which they give bit for bit (what the kernels read instead).
    from forkv.engine.native.layers import expand_kparams

    src = tmp_path / f"{arch}.gguf"
    write_mixed_gguf(src, arch)
    qnt = convert_gguf(src, tmp_path / "quant", quantized=True)
    params = read_kernel_params(qnt)
    layers = CONFIGS[arch]["num_hidden_layers"]
    names = {"attn_k": "self_attn.k_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_down": "mlp.down_proj"}
    assert set(params) == {f"model.layers.{i}.{m}" for i in range(layers)
                           for m in names.values()}
    weights, groups = mx.load(str(qnt / "model.safetensors")), read_kernel_groups(qnt)
    for module, kp in params.items():
        assert kp.dtype == mx.uint8
        if module.endswith("down_proj"):  # Q6_K: groups of 16, symmetric
            _, s, b, bits, group = groups[module]
            assert (bits, group) == (6, 16)
            got_s, got_b = expand_kparams(kp, 16)
            assert got_b is None and mx.array_equal(b, s * -32.0).item()
        else:
            s, b = weights[f"{module}.scales"], weights[f"{module}.biases"]
            got_s, got_b = expand_kparams(kp, 32)
            assert mx.array_equal(got_b.view(mx.uint32), b.view(mx.uint32)).item(), module
        assert mx.array_equal(got_s.view(mx.uint32), s.view(mx.uint32)).item(), module
    assert json.loads((qnt / "forkv_gguf.json").read_text())["converter_version"] == 4


def test_float_conversion_is_unchanged_by_the_mode(tmp_path, wide_configs):
    src = tmp_path / "llama.gguf"
    write_mixed_gguf(src, "llama")
    flt = convert_gguf(src, tmp_path / "float", quantized=False)
    assert "quantization" not in json.loads((flt / "config.json").read_text())
    assert "quantized" not in json.loads((flt / "forkv_gguf.json").read_text())
    header = read_gguf_header(src)
    arrays = mx.load(str(flt / "model.safetensors"))
    assert all(a.dtype == mx.float32 for a in arrays.values())
    assert len(arrays) == len(header.tensors)


def test_converted_folder_caches_quantized_conversions_apart(tmp_path, monkeypatch,
                                                             wide_configs):
    from forkv.engine.models.gguf_cache import converted_folder

    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "llama.gguf"
    write_mixed_gguf(src, "llama")
    quant, _ = converted_folder(src, quantized=True)
    flt, _ = converted_folder(src)
    assert quant.name == flt.name + "-q"
    assert "quantization" in json.loads((quant / "config.json").read_text())
    assert "quantization" not in json.loads((flt / "config.json").read_text())
    assert converted_folder(src, quantized=True)[0] == quant  # a hit, not a second folder


def _real_files():
    from forkv.engine.models.named import NAMED_MODELS

    for name in ("gemma3-270m", "smollm2-135m"):
        try:
            path = NAMED_MODELS[name].gguf_path(download=False)
        except Exception:  # noqa: BLE001 - any failure to find it locally is a skip
            path = None
        yield pytest.param(name, path, id=name)


def _folder_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("name,path", list(_real_files()))
def test_real_files_quantized_equal_their_float_conversion(tmp_path, name, path):
    if path is None or not path.exists():
        pytest.skip(f"{name}'s GGUF file is not on this machine (fetch it with forkv first)")
    t0 = time.perf_counter()
    flt = convert_gguf(path, tmp_path / "float")
    t1 = time.perf_counter()
    qnt = convert_gguf(path, tmp_path / "quant", quantized=True)
    t2 = time.perf_counter()
    seen = assert_quantized_equals_float(qnt, flt)
    record = json.loads((qnt / "forkv_gguf.json").read_text())
    assert sum(record["quantized_tensors"].values()) == sum(seen.values())
    print(f"\n{name}: float {_folder_bytes(flt) / 1e6:.1f} MB in {t1 - t0:.1f}s, quantized "
          f"{_folder_bytes(qnt) / 1e6:.1f} MB in {t2 - t1:.1f}s; quantized "
          f"{record['quantized_tensors']}, float {record['float_tensors']}")
    assert _folder_bytes(qnt) < _folder_bytes(flt) / 2


@pytest.mark.slow
def test_real_gemma3_quantized_keeps_the_float_greedy_continuation(tmp_path):
    from forkv.engine.models.named import NAMED_MODELS
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache
    from test_gguf_real import HAND_GREEDY, HAND_IDS

    path = NAMED_MODELS["gemma3-270m"].gguf_path(download=False)
    if path is None or not path.exists():
        pytest.skip("gemma3-270m's GGUF file is not on this machine (fetch it with forkv first)")
    model, _ = load(str(convert_gguf(path, tmp_path / "quant", quantized=True)))
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    y, cache, tokens = mx.array([HAND_IDS]), make_prompt_cache(model), []
    for _ in range(len(HAND_GREEDY)):
        tokens.append(int(mx.argmax(model(y, cache=cache)[0, -1]).item()))
        y = mx.array([[tokens[-1]]])
    # Not guaranteed (quantized matmul rounds differently), but measured: the same 24 tokens.
    assert tokens == HAND_GREEDY
