"""The architectures forkv converts from GGUF, and how llama.cpp's writer changed each one.

An `Arch` names the mlx-lm model type a `general.architecture` becomes, how its GGUF tensor
names map to mlx-lm's, and which of llama.cpp's conversions must be undone (Gemma's `1 + w`
norms, llama's rotary row permutation). Adding an architecture is one entry in `ARCHS`.

This module knows names and conventions only: no file reading, no numerics beyond the two
inverse transforms (the q/k one as a row order, so it moves quantized rows too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .header import GGUFError

__all__ = ["ARCHS", "Arch", "arch_for", "permute_rows", "unpermute", "unpermute_order"]

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",  # llama / qwen: the norm before the MLP
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per layer: before and after attention, before and after the MLP.
_GEMMA3_LAYER = dict(_LAYER, ffn_norm="pre_feedforward_layernorm",
                     post_attention_norm="post_attention_layernorm",
                     post_ffw_norm="post_feedforward_layernorm")
# Tensors llama.cpp adds that mlx-lm derives from config.json instead (config.py reads them).
SKIPPED = frozenset({"rope_freqs.weight"})


@dataclass(frozen=True, slots=True)
class Arch:
    """How one GGUF architecture becomes an mlx-lm model folder."""

    name: str  # general.architecture
    model_type: str  # mlx-lm's model_type
    layer_names: dict[str, str] = field(default_factory=lambda: _LAYER)
    norm_shift: float = 0.0  # llama.cpp stored every `*norm.weight` as w + norm_shift
    permute_qk: bool = False  # llama.cpp permuted q/k rows from rotate-half to interleaved
    end_of_turn: tuple[str, ...] = ()  # the chat template's end-of-turn tokens

    def map_name(self, gguf_name: str) -> str:
        """The mlx-lm weight name of a GGUF tensor; `GGUFError` if this arch has no such."""
        parts = gguf_name.split(".")
        if len(parts) == 2 and parts[0] in _TOP and parts[1] in ("weight", "bias"):
            return f"{_TOP[parts[0]]}.{parts[1]}"
        if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
                and parts[2] in self.layer_names and parts[3] in ("weight", "bias")):
            return f"model.layers.{int(parts[1])}.{self.layer_names[parts[2]]}.{parts[3]}"
        raise GGUFError(f"GGUF tensor {gguf_name!r} is not part of a {self.name} model that "
                        f"forkv can convert; the file may be a variant forkv does not support.")

    def restore(self, gguf_name: str, w: np.ndarray, num_heads: int,
                num_kv_heads: int) -> np.ndarray:
        """Undo llama.cpp's forward conversions on one float32 tensor."""
        if self.shifted(gguf_name):
            w = w - np.float32(self.norm_shift)
        order = self.row_order(gguf_name, w.shape[0], num_heads, num_kv_heads)
        return w if order is None else permute_rows(w, order)

    def shifted(self, gguf_name: str) -> bool:
        """Whether llama.cpp stored this tensor's values shifted (so only a float tensor can
        carry the restored values)."""
        return bool(self.norm_shift) and gguf_name.endswith("norm.weight")

    def row_order(self, gguf_name: str, rows: int, num_heads: int,
                  num_kv_heads: int) -> np.ndarray | None:
        """The row order (`w[order]`) undoing llama.cpp's q/k permutation of this tensor, or
        None when its rows were left as they are. Rows move whole, so this applies to the
        rows of a quantized tensor's packed weight, scales and biases alike."""
        if not self.permute_qk:
            return None
        kind = gguf_name.split(".")[-2]
        if kind not in ("attn_q", "attn_k"):
            return None
        return unpermute_order(rows, num_heads if kind == "attn_q" else num_kv_heads)


def unpermute_order(dim: int, num_heads: int) -> np.ndarray:
    """The row order of `unpermute`: the inverse of convert_hf_to_gguf's `LlamaModel.permute`
    (`w.reshape(n_head, 2, dim // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`)."""
    if dim % (2 * num_heads):
        raise GGUFError(f"a q/k tensor of {dim} rows does not split into {num_heads} heads.")
    return np.arange(dim).reshape(num_heads, dim // num_heads // 2, 2).swapaxes(1, 2).reshape(-1)


def permute_rows(w: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`w` with its rows (first axis) in `order`, contiguous."""
    return np.ascontiguousarray(w[order])


def unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's `LlamaModel.permute` on the rows of `w`."""
    return permute_rows(w, unpermute_order(w.shape[0], num_heads))


def permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's forward permutation (for tests that write GGUF files like its converter)."""
    dim, rest = w.shape[0], w.shape[1:]
    return w.reshape(num_heads, 2, dim // num_heads // 2, *rest).swapaxes(1, 2).reshape(w.shape)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "llama", permute_qk=True, end_of_turn=("<|eot_id|>", "<|eom_id|>")),
    Arch("qwen2", "qwen2", end_of_turn=("<|im_end|>",)),
    Arch("qwen3", "qwen3", end_of_turn=("<|im_end|>",)),
    Arch("gemma3", "gemma3_text", layer_names=_GEMMA3_LAYER, norm_shift=1.0,
         end_of_turn=("<end_of_turn>",)),
)}


def arch_for(metadata: dict, path) -> Arch:
    """The `Arch` of a file's `general.architecture`; `GGUFError` naming the supported ones."""
    name = metadata.get("general.architecture")
    if not isinstance(name, str):
        raise GGUFError(f"GGUF file {path}: no general.architecture string in its metadata; "
                        f"it is not a model file forkv can convert.")
    if name not in ARCHS:
        raise GGUFError(f"GGUF file {path}: architecture {name!r} cannot be converted; forkv "
                        f"converts {', '.join(sorted(ARCHS))}.")
    return ARCHS[name]
