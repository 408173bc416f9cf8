"""config.json and generation_config.json for mlx-lm, from a GGUF file's metadata.

Reads llama.cpp's `{arch}.*` keys and fills in what llama.cpp hardcodes rather than stores
(Gemma 3's 5:1 sliding pattern and local rope base, its query scale; Llama 3's rope scaling,
which the file carries only as a `rope_freqs` tensor). Knows nothing about tensor data beyond
shapes and that one tensor.
"""

from __future__ import annotations

import math

import numpy as np

from .archs import Arch
from .header import GGUFError, GGUFHeader

__all__ = ["make_config", "make_generation_config"]


class _Meta:
    """Typed access to `{arch}.` keys; a missing or mistyped key is one `GGUFError`."""

    def __init__(self, header: GGUFHeader, arch: Arch):
        self.md, self.prefix, self.path = header.metadata, f"{arch.name}.", header.path

    def get(self, key: str, kind: type, default=None):
        full = self.prefix + key
        value = self.md.get(full, default)
        if value is None:
            return None
        ok = (type(value) is int if kind is int
              else isinstance(value, (int, float)) and type(value) is not bool
              if kind is float else isinstance(value, kind))
        if not ok or (kind is int and value <= 0):
            raise GGUFError(f"GGUF file {self.path}: metadata {full} is {value!r}, not a "
                            f"positive {kind.__name__}; the file is malformed.")
        return _f32(value) if kind is float else value

    def need(self, key: str, kind: type):
        value = self.get(key, kind)
        if value is None:
            raise GGUFError(f"GGUF file {self.path}: metadata {self.prefix}{key} is missing; "
                            f"the file is incomplete.")
        return value


def _f32(x) -> float:
    """The shortest decimal of a float32 value (so 1e-6 reads 1e-06, not 9.99999997e-07)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="0"))


def make_config(header: GGUFHeader, arch: Arch, rope_freqs: np.ndarray | None) -> dict:
    """The mlx-lm config.json dict. `rope_freqs` is the `rope_freqs.weight` tensor, if any."""
    m = _Meta(header, arch)
    tensors = header.tensors
    if "token_embd.weight" not in tensors:
        raise GGUFError(f"GGUF file {header.path}: no token_embd.weight tensor; it is not a "
                        f"complete {arch.name} model.")
    hidden, heads = m.need("embedding_length", int), m.need("attention.head_count", int)
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": m.need("block_count", int),
        "intermediate_size": m.need("feed_forward_length", int),
        "num_attention_heads": heads,
        "num_key_value_heads": m.get("attention.head_count_kv", int, heads),
        "head_dim": m.get("attention.key_length", int, hidden // heads),
        "rms_norm_eps": m.need("attention.layer_norm_rms_epsilon", float),
        "vocab_size": tensors["token_embd.weight"].shape[0],
        "max_position_embeddings": m.get("context_length", int, 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    theta = m.get("rope.freq_base", float)
    if theta is not None:
        config["rope_theta"] = theta
    scaling = _rope_scaling(m, header, config, rope_freqs)
    if scaling is not None:
        config["rope_scaling"] = scaling
    if arch.name == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    if arch.name == "gemma3":
        config.update(_gemma3(m, config))
    return config


def _gemma3(m: _Meta, config: dict) -> dict:
    # llama.cpp hardcodes these for gemma3 (llama-model.cpp): a global layer every 6th, local
    # rope base 10000, and the query scale 1/sqrt(head_dim), except 27B's 1/sqrt(hidden/heads).
    pattern = m.md.get(m.prefix + "attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # newer writers: one bool per layer, true = sliding
        period = next((i + 1 for i, s in enumerate(pattern) if not s), 0)
        if not period or any(s != ((i + 1) % period != 0) for i, s in enumerate(pattern)):
            raise GGUFError(f"GGUF file {m.path}: sliding window pattern {pattern} is not a "
                            f"repeating one that mlx-lm's gemma3_text can run.")
        pattern = period
    elif type(pattern) is not int or pattern <= 0:
        raise GGUFError(f"GGUF file {m.path}: sliding window pattern {pattern!r} is invalid.")
    scale = m.get("attention.scale", float)
    if scale is not None:
        scalar = 1.0 / (scale * scale)
    elif config["num_hidden_layers"] == 62:  # 27B
        scalar = config["hidden_size"] // config["num_attention_heads"]
    else:
        scalar = config["head_dim"]
    return {
        "sliding_window": m.need("attention.sliding_window", int),
        "sliding_window_pattern": pattern,
        "rope_local_base_freq": m.get("rope.freq_base_swa", float, 10000.0),
        "rope_theta": config.get("rope_theta", 1_000_000.0),
        "query_pre_attn_scalar": scalar,
    }


def _rope_scaling(m: _Meta, header: GGUFHeader, config: dict, rope_freqs) -> dict | None:
    kind = m.md.get(m.prefix + "rope.scaling.type")
    if rope_freqs is not None:
        return _llama3_scaling(header, config, rope_freqs)
    if kind in (None, "none"):
        return None
    factor = m.get("rope.scaling.factor", float)
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn" and factor:
        scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings":
                   m.need("rope.scaling.original_context_length", int)}
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if m.get(f"rope.scaling.{key}", float) is not None:
                scaling[name] = m.get(f"rope.scaling.{key}", float)
        return scaling
    raise GGUFError(f"GGUF file {header.path}: rope scaling {kind!r} (factor {factor}) cannot be "
                    f"converted; forkv converts linear, yarn and Llama 3 scaling.")


def _llama3_scaling(header: GGUFHeader, config: dict, rope_freqs: np.ndarray) -> dict:
    """Llama 3.1+ rope scaling from llama.cpp's per-frequency factors, which its converter
    computes from (factor, low/high freq factor, original context) exactly as mlx-lm does."""
    dims = config["head_dim"]
    factors = np.asarray(rope_freqs, np.float64).reshape(-1)
    if factors.shape != (dims // 2,):
        raise GGUFError(f"GGUF file {header.path}: rope_freqs has {factors.size} entries, not "
                        f"head_dim/2 = {dims // 2}.")
    factor = float(factors.max())
    base = config.get("rope_theta", 10000.0)
    wavelen = 2 * math.pi * base ** (np.arange(0, dims, 2) / dims)
    for old, low, high in ((8192, 1.0, 4.0), (8192, 1.0, 2.0), (4096, 1.0, 4.0)):
        smooth = (old / wavelen - low) / (high - low)
        expect = np.where(wavelen < old / high, 1.0, np.where(
            wavelen > old / low, factor, 1 / ((1 - smooth) / factor + smooth)))
        if np.allclose(expect, factors, rtol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": old}
    raise GGUFError(f"GGUF file {header.path}: its rope_freqs tensor matches no Llama 3 rope "
                    f"scaling forkv knows; it cannot be converted.")


def make_generation_config(header: GGUFHeader, arch: Arch) -> dict:
    """bos and eos ids: the file's eos plus the chat template's end-of-turn tokens."""
    md = header.metadata
    tokens = md.get("tokenizer.ggml.tokens") or []
    eos = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        if type(md.get(key)) is int and 0 <= md[key] < len(tokens):
            eos.append(md[key])
    index = {t: i for i, t in enumerate(tokens) if t in arch.end_of_turn}
    eos += [index[t] for t in arch.end_of_turn if t in index]
    out: dict = {"eos_token_id": list(dict.fromkeys(eos))}
    bos = md.get("tokenizer.ggml.bos_token_id")
    if type(bos) is int and 0 <= bos < len(tokens):
        out["bos_token_id"] = bos
    return out
