"""Built-in demo vision models: random-weight Qwen2-VL instances (mlx-vlm's `qwen2_vl`).

`demo_vlm_config(arch, size)` gives the config.json and `build_vlm(config, folder, seed)` writes
a normal Hugging Face-style folder — weights, our byte-level tokenizer plus Qwen's vision
special tokens, a chat template that renders image parts, and a `preprocessor_config.json` —
so `mlx_vlm.load(folder)` works offline. mlx-vlm is imported only while building. Knows
nothing about generation; `demo.ensure_demo_model` decides where folders live.
"""

from __future__ import annotations

import json
from pathlib import Path

from .demo_tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, special_token_id

DEMO_VLM_VERSION = 1

# Qwen2-VL's vision tokens, numbered right after the text demo's special tokens.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
_IMAGE_PART = "{{- '<image>' -}}"
VLM_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    _IMAGE_PART, "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}")
assert VLM_CHAT_TEMPLATE != CHAT_TEMPLATE, "the text template no longer renders image parts"

# `tiny` is for tests: a 2-layer tower on 14-pixel patches, a few dozen image tokens per
# image. `small` keeps Qwen2-VL-2B's widths (tower 1280 x 16 heads, LM 1536 x 12 heads, 2 KV
# heads) at a quarter of both depths (8 of 32, 7 of 28), so the tower-to-LM cost ratio per
# image token is the real model's; a high-resolution photo is capped at 512 image tokens
# (2,048 patches, about 730x550 pixels; Qwen2-VL suggests caps up to 1,280 tokens).
_CONFIGS: dict[str, dict[str, dict]] = {
    "qwen2_vl": {
        "tiny": dict(
            text=dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                      rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2),
            max_pixels=128 * 28 * 28),
        "small": dict(
            text=dict(hidden_size=1536, num_hidden_layers=7, intermediate_size=8960,
                      num_attention_heads=12, num_key_value_heads=2, vocab_size=16384,
                      rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
            vision=dict(depth=8, embed_dim=1280, num_heads=16, mlp_ratio=4),
            max_pixels=512 * 28 * 28),
    },
}
VISION_ARCHS = tuple(_CONFIGS)


def vision_token_id(name: str) -> int:
    return 256 + len(SPECIAL_TOKENS) + VISION_TOKENS.index(name)


def demo_vlm_config(arch: str, size: str) -> dict:
    """The full config.json of a demo VLM (Qwen2-VL layout: text fields at the top level)."""
    spec = _CONFIGS[arch][size]
    text = spec["text"]
    return dict(
        model_type=arch, **text, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        max_position_embeddings=32768, tie_word_embeddings=True,
        eos_token_id=special_token_id(EOS_TOKEN), bos_token_id=special_token_id(PAD_TOKEN),
        vision_start_token_id=vision_token_id("<|vision_start|>"),
        vision_end_token_id=vision_token_id("<|vision_end|>"),
        image_token_id=vision_token_id("<|image_pad|>"),
        video_token_id=vision_token_id("<|video_pad|>"),
        vision_config=dict(spec["vision"], model_type=arch, in_chans=3,
                           hidden_size=text["hidden_size"], patch_size=14,
                           spatial_patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        forkv_demo=f"{arch}:{size}:v{DEMO_VLM_VERSION}",
        forkv_max_pixels=spec["max_pixels"],
    )


def build_vlm(config: dict, folder: Path, seed: int) -> None:
    """Write weights, tokenizer, chat template and processor configs into `folder`."""
    import mlx.core as mx
    from mlx_vlm.utils import get_model_and_args

    from .demo import save_random_model  # demo imports this module: import at call time

    num_tokens = _write_tokenizer(folder)
    assert config["vocab_size"] >= num_tokens
    arch_module, _ = get_model_and_args(dict(config))
    model_config = arch_module.ModelConfig.from_dict(dict(config))
    model_config.text_config = arch_module.TextConfig.from_dict(dict(config))
    model_config.vision_config = arch_module.VisionConfig.from_dict(config["vision_config"])
    mx.random.seed(seed)
    # Damp only the tied text embeddings ("embed" alone would also hit the vision patch embed).
    save_random_model(arch_module.Model(model_config), config, folder, damp="embed_tokens")
    # Qwen2-VL's image processor settings (CLIP mean/std), with the demo's own pixel cap.
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "min_pixels": 4 * 28 * 28, "max_pixels": config["forkv_max_pixels"],
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }, indent=2))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": VLM_CHAT_TEMPLATE}))


def _write_tokenizer(folder: Path) -> int:
    """The text demos' byte-level tokenizer plus the vision tokens and the VLM template."""
    from tokenizers import Tokenizer

    from .demo_tokenizer import write_tokenizer

    write_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(VISION_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    assert tok.token_to_id("<|image_pad|>") == vision_token_id("<|image_pad|>")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = VLM_CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()
