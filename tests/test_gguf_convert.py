"""convert_gguf: tiny llama / qwen2 / qwen3 / gemma3 models written as llama.cpp writes them
come back as mlx-lm folders with the original weights and logits; problems are one line."""

import json

import mlx.core as mx
import numpy as np
import pytest
from forkv.engine.errors import ModelLoadError
from forkv.engine.models.gguf import GGUFError, convert_gguf, read_gguf_header
from forkv.engine.models.gguf.tensors import dequantize
from gguf_files import CONFIGS, gguf_tensors, random_model, write_gguf

ARCHS = tuple(CONFIGS)
PROMPT = [[1, 5, 17, 200, 42, 7, 99, 3, 250, 11, 64, 128]]


def _convert(tmp_path, arch, qtype="F32", dtype=None):
    model, weights = random_model(arch)
    src = tmp_path / f"{arch}-{qtype}.gguf"
    write_gguf(src, arch, gguf_tensors(arch, weights), qtype)
    return model, weights, convert_gguf(src, tmp_path / f"{arch}-{qtype}", dtype=dtype)


def _load(folder):
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_weights_and_logits_match_the_original(tmp_path, arch):
    model, weights, out = _convert(tmp_path, arch)
    from safetensors.numpy import load_file

    back = load_file(out / "model.safetensors")
    assert set(back) == set(weights)
    for name, w in weights.items():
        if arch == "gemma3" and name.endswith("norm.weight"):  # (w + 1) - 1 rounds in float32
            np.testing.assert_allclose(back[name], w, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(back[name], w, err_msg=name)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == CONFIGS[arch]["model_type"]
    ours = _load(out)(mx.array(PROMPT))
    want = model(mx.array(PROMPT))
    np.testing.assert_allclose(np.array(ours), np.array(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch,qtype", [("llama", "Q8_0"), ("qwen2", "Q4_0"), ("qwen3", "Q5_1"),
                                        ("gemma3", "Q4_1"), ("llama", "F16"), ("qwen3", "Q5_0")])
def test_quantized_weights_equal_the_reference_dequantization(tmp_path, arch, qtype):
    from safetensors.numpy import load_file

    model, weights, out = _convert(tmp_path, arch, qtype, dtype="float32")
    back = load_file(out / "model.safetensors")
    header = read_gguf_header(tmp_path / f"{arch}-{qtype}.gguf")
    tolerance = {"Q8_0": 0.01, "F16": 1e-3}.get(qtype, 0.15)
    for name, w in weights.items():
        scale = np.abs(w).max()
        assert np.abs(back[name] - w).max() <= tolerance * scale, name
    # Exactly llama.cpp's reference dequantization, before the inverse transforms.
    ref = dequantize(header, header.tensors["blk.0.ffn_down.weight"])
    np.testing.assert_array_equal(back["model.layers.0.mlp.down_proj.weight"], ref)
    logits = np.array(_load(out)(mx.array(PROMPT)))
    want = np.array(model(mx.array(PROMPT)))
    assert np.abs(logits - want).max() < 0.5 * np.abs(want).max()


def test_storage_dtype_bfloat16_keeps_f32_tensors(tmp_path):
    _, weights, out = _convert(tmp_path, "qwen3", "Q8_0", dtype="bfloat16")
    arrays = mx.load(str(out / "model.safetensors"))
    assert arrays["model.layers.0.self_attn.q_proj.weight"].dtype == mx.bfloat16
    assert arrays["model.norm.weight"].dtype == mx.float32
    np.testing.assert_array_equal(np.array(arrays["model.norm.weight"]),
                                  weights["model.norm.weight"])


def test_folder_files_and_generation_config(tmp_path):
    _, _, out = _convert(tmp_path, "qwen2")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "forkv_gguf.json"} <= names
    info = json.loads((out / "forkv_gguf.json").read_text())
    assert info["source"] == "qwen2-F32.gguf" and info["converter_version"] >= 1
    gen = json.loads((out / "generation_config.json").read_text())
    vocab = read_gguf_header(tmp_path / "qwen2-F32.gguf").metadata["tokenizer.ggml.tokens"]
    assert [vocab[i] for i in gen["eos_token_id"]] == ["<|endoftext|>", "<|im_end|>"]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # temp folder gone
    with pytest.raises(GGUFError, match="already exists"):
        convert_gguf(tmp_path / "qwen2-F32.gguf", out)


def test_sharded_output_loads(tmp_path, monkeypatch):
    from forkv.engine.models.gguf import writer

    monkeypatch.setattr(writer, "SHARD_BYTES", 40_000)
    model, _, out = _convert(tmp_path, "llama")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    np.testing.assert_allclose(np.array(_load(out)(mx.array(PROMPT))),
                               np.array(model(mx.array(PROMPT))), rtol=1e-4, atol=1e-4)


def test_unknown_architecture_is_one_line(tmp_path):
    _, weights = random_model("llama")
    src = tmp_path / "m.gguf"
    write_gguf(src, "mamba", gguf_tensors("llama", weights))
    with pytest.raises(ModelLoadError) as e:
        convert_gguf(src, tmp_path / "out")
    assert "'mamba'" in str(e.value) and "gemma3, llama, qwen2, qwen3" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_unconvertible_tensor_type_is_one_line(tmp_path):
    import gguf
    from gguf_files import add_model_metadata, add_vocab, bpe_vocab

    _, weights = random_model("qwen3")
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(src), "qwen3")
    add_model_metadata(w, "qwen3")
    add_vocab(w, bpe_vocab())
    for name, t in gguf_tensors("qwen3", weights).items():  # one F64 tensor, the rest F32
        w.add_tensor(name, t.astype(np.float64 if name == "blk.0.ffn_up.weight" else np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(GGUFError) as e:
        convert_gguf(src, tmp_path / "out")
    message = str(e.value)
    assert "'blk.0.ffn_up.weight'" in message and "F64" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_unknown_tensor_name_is_one_line(tmp_path):
    _, weights = random_model("qwen2")
    tensors = dict(gguf_tensors("qwen2", weights))
    tensors["blk.0.ssm_conv1d.weight"] = np.zeros((4, 64), np.float32)
    src = tmp_path / "m.gguf"
    write_gguf(src, "qwen2", tensors)
    with pytest.raises(GGUFError, match="'blk.0.ssm_conv1d.weight'"):
        convert_gguf(src, tmp_path / "out")


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path):
    from forkv.engine.models.gguf.archs import ARCHS
    from forkv.engine.models.gguf.config import make_config

    _, weights = random_model("llama")
    dims, base, factor = 16, 500000.0, 8.0
    wavelen = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    smooth = (8192 / wavelen - 1) / 3
    freqs = np.where(wavelen < 8192 / 4, 1.0, np.where(
        wavelen > 8192, factor, 1 / ((1 - smooth) / factor + smooth))).astype(np.float32)
    tensors = dict(gguf_tensors("llama", weights), **{"rope_freqs.weight": freqs})
    src = tmp_path / "m.gguf"
    write_gguf(src, "llama", tensors)
    header = read_gguf_header(src)
    config = make_config(header, ARCHS["llama"], freqs)
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}
    with pytest.raises(GGUFError, match="rope_freqs"):
        make_config(header, ARCHS["llama"], freqs * 1.5)
