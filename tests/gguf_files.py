"""Test helpers: tiny random mlx-lm models written as GGUF files the way llama.cpp's
convert_hf_to_gguf.py writes them (its tensor names, Gemma's `1 + w` norms, llama's q/k row
permutation, 1-D tensors kept F32), plus tiny tokenizer vocabularies. Independent of
forkv.engine.models.gguf on purpose: the converter is checked against this, not against itself.
"""

from __future__ import annotations

import numpy as np

GGUF_NAMES = {  # mlx-lm layer weight -> llama.cpp tensor
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_GEMMA_NAMES = dict(GGUF_NAMES, pre_feedforward_layernorm="ffn_norm",
                    post_attention_layernorm="post_attention_norm",
                    post_feedforward_layernorm="post_ffw_norm")
_NAMES = dict(GGUF_NAMES, post_attention_layernorm="ffn_norm")

BASE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "vocab_size": 320, "max_position_embeddings": 2048}
CONFIGS = {
    "llama": dict(BASE, model_type="llama", rope_theta=500000.0, tie_word_embeddings=False),
    "qwen2": dict(BASE, model_type="qwen2", rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32, rope_theta=1000000.0,
                  tie_word_embeddings=True),
    # llama.cpp hardcodes gemma3's 5:1 pattern, local base 10000 and query scale = head_dim.
    "gemma3": dict(BASE, model_type="gemma3_text", num_hidden_layers=6, head_dim=32,
                   num_key_value_heads=1, query_pre_attn_scalar=32, sliding_window=16,
                   sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0),
}


def random_model(arch: str, seed: int = 0):
    """A tiny mlx-lm model of `arch` with every parameter random (norms too, so a missed
    `1 + w` shift or permutation shows), and its weights as float32 numpy arrays."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = CONFIGS[arch]
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {k: (rng.standard_normal(v.shape) * (0.3 if v.ndim == 1 else 0.08))
               .astype(np.float32) for k, v in tree_flatten(model.parameters())}
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    return model, weights


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_tensors(arch: str, weights: dict) -> dict[str, np.ndarray]:
    """mlx-lm weights renamed and transformed as llama.cpp's converter does."""
    config, names = CONFIGS[arch], _GEMMA_NAMES if arch == "gemma3" else _NAMES
    out = {}
    for key, w in weights.items():
        parts = key.split(".")
        if key.startswith("model.layers."):
            i, rest = parts[2], ".".join(parts[3:-1])
            name = f"blk.{i}.{names[rest]}.{parts[-1]}"
        else:
            name = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
                    "lm_head": "output"}[".".join(parts[:-1])] + "." + parts[-1]
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        if arch == "llama" and ".attn_q." in name:
            w = permute(w, config["num_attention_heads"])
        if arch == "llama" and ".attn_k." in name:
            w = permute(w, config["num_key_value_heads"])
        out[name] = w
    return out


def add_model_metadata(writer, arch: str) -> None:
    c = CONFIGS[arch]
    heads = c["num_attention_heads"]
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_freq_base(c["rope_theta"])
    head_dim = c.get("head_dim", c["hidden_size"] // heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch == "gemma3":
        writer.add_sliding_window(c["sliding_window"])


def sentencepiece_vocab() -> dict:
    """A tiny `llama`-type vocabulary: specials, 256 byte-fallback tokens, a few pieces."""
    # Each merged piece splits into two pieces of the vocabulary, best-scored (first) first.
    pieces = ["ll", "he", "llo", "hello", "\u2581hello", "wo", "ld", "rld", "world",
              "\u2581world", "\u2581", "h", "e", "l", "o", "w", "r", "d", "t", "a"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def bpe_vocab() -> dict:
    """A tiny `gpt2`-type vocabulary: the 256 byte symbols, a few merges, two specials."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = ["\u0120 t", "h e", "\u0120t he", "l l", "\u0120 w", "o r", "\u0120w or", "l d",
              "\u0120wor ld", "he ll", "hell o"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = alphabet + merged + ["<|endoftext|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": len(tokens) - 2,
            "tokenizer.ggml.eos_token_id": len(tokens) - 2,
            "tokenizer.ggml.add_bos_token": False}


def add_vocab(writer, vocab: dict) -> None:
    from gguf import GGUFValueType

    for key, value in vocab.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_key_value(key, value, GGUFValueType.STRING)


def write_gguf(path, arch: str, tensors: dict[str, np.ndarray], qtype: str = "F32",
               vocab: dict | None = None, extra=None) -> None:
    """Write `tensors` (llama.cpp names, float32) as a GGUF file; 2-D ones quantized to
    `qtype`, 1-D ones F32 as llama.cpp keeps them."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), arch)
    add_model_metadata(writer, arch) if arch in CONFIGS else None
    add_vocab(writer, vocab if vocab is not None else
              (sentencepiece_vocab() if arch in ("llama", "gemma3") else bpe_vocab()))
    if extra:
        extra(writer)
    qt = gguf.GGMLQuantizationType[qtype]
    for name, w in tensors.items():
        if w.ndim == 1 or qtype == "F32":
            writer.add_tensor(name, w.astype(np.float32))
        elif qtype == "F16":
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(w, qt), raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
