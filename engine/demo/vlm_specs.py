"""Sizes and special tokens of the demo vision models (data only; vlm.py builds them).

`tiny` is for tests: 2-layer towers, a few dozen image tokens per image, the family's cache
layout (sliding-window + global layers for Gemma, gated-delta + global for Qwen 3.5) on a
64-wide language model. `small` keeps each family's widths at a fraction of its depth, so the
tower-to-LM cost per image token is close to the real model's:
- qwen2_vl: Qwen2-VL-2B (tower 1280 x 16 heads, LM 1536 x 12 heads), a quarter of both depths;
- qwen3_5: Qwen3.5-0.8B's LM (the text demo's) and a 768-wide tower at half depth (6 of 12);
- gemma3: Gemma-3's SigLIP tower (1152 wide) at 6 of 27 layers, on 448-pixel images (256
  tokens, as the real 896-pixel one), and the text demo's Gemma-3-270M-shaped LM;
- gemma4: Gemma-4's 768-wide tower at half depth, 280 soft tokens per image, and the text
  demo's Gemma-4-shaped LM.
"""

from __future__ import annotations

_CLIP = dict(mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711])
_HALF = dict(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
_QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
_QWEN_IDS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
             "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}

# Per model type: its vision special tokens, what the chat template renders for an image part,
# which config fields name which token, and the tokenizer attributes its processor reads.
FAMILIES: dict[str, dict] = {
    "qwen2_vl": dict(tokens=_QWEN_TOKENS, ids=_QWEN_IDS,
                     image_part="<|vision_start|><|image_pad|><|vision_end|>"),
    "qwen3_5": dict(tokens=_QWEN_TOKENS, ids=_QWEN_IDS,
                    image_part="<|vision_start|><|image_pad|><|vision_end|>",
                    named={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                           "vision_start_token": "<|vision_start|>",
                           "vision_end_token": "<|vision_end|>"}),
    # Gemma 3's template renders <start_of_image>; its processor expands that to
    # "\n\n<start_of_image>" + 256 x <image_soft_token> + "<end_of_image>\n\n".
    "gemma3": dict(tokens=["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
                   ids={"boi_token_index": "<start_of_image>", "eoi_token_index": "<end_of_image>",
                        "image_token_index": "<image_soft_token>"},
                   image_part="<start_of_image>",
                   named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                          "image_token": "<image_soft_token>"}),
    # Gemma 4's template renders <|image|>; its processor expands that to
    # <|image> + n x <|image|> + <image|>, n from the image's size.
    "gemma4": dict(tokens=["<|image>", "<image|>", "<|image|>", "<|audio|>"],
                   ids={"boi_token_id": "<|image>", "eoi_token_id": "<image|>",
                        "image_token_id": "<|image|>", "audio_token_id": "<|audio|>"},
                   image_part="<|image|>",
                   named={"boi_token": "<|image>", "eoi_token": "<image|>",
                          "image_token": "<|image|>", "audio_token": "<|audio|>"}),
}

# Demo names (demo:<name>) -> mlx-vlm model type; the text demos own the plain family names.
MODEL_TYPES = {"qwen2_vl": "qwen2_vl", "qwen3_5_vl": "qwen3_5", "gemma3_vl": "gemma3",
               "gemma4_vl": "gemma4"}

SPECS: dict[str, dict[str, dict]] = {
    "qwen2_vl": {
        "tiny": dict(
            text=dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                      rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, in_chans=3,
                        patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
                        temporal_patch_size=2),
            processor=dict(_CLIP, patch_size=14, max_pixels=128 * 28 * 28)),
        "small": dict(
            text=dict(hidden_size=1536, num_hidden_layers=7, intermediate_size=8960,
                      num_attention_heads=12, num_key_value_heads=2, vocab_size=16384,
                      rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
            vision=dict(depth=8, embed_dim=1280, num_heads=16, mlp_ratio=4, in_chans=3,
                        patch_size=14, spatial_patch_size=14, spatial_merge_size=2,
                        temporal_patch_size=2),
            processor=dict(_CLIP, patch_size=14, max_pixels=512 * 28 * 28)),
    },
    "qwen3_5_vl": {
        "tiny": dict(
            text=dict(model_type="qwen3_5_text", hidden_size=64, num_hidden_layers=4,
                      intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                      linear_key_head_dim=16, linear_value_head_dim=16,
                      linear_conv_kernel_dim=4, full_attention_interval=2, vocab_size=512,
                      rope_parameters={"type": "default", "mrope_section": [2, 1, 1],
                                       "rope_theta": 10_000_000.0,
                                       "partial_rotary_factor": 0.5,
                                       "mrope_interleaved": True}),
            vision=dict(model_type="qwen3_5", depth=2, hidden_size=32, intermediate_size=64,
                        num_heads=2, out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                        temporal_patch_size=2, num_position_embeddings=256, in_channels=3,
                        deepstack_visual_indexes=[]),
            processor=dict(_HALF, patch_size=16, max_pixels=128 * 32 * 32)),
        "small": dict(
            text=dict(model_type="qwen3_5_text", hidden_size=1024, num_hidden_layers=8,
                      intermediate_size=3072, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                      linear_key_head_dim=128, linear_value_head_dim=128,
                      linear_conv_kernel_dim=4, full_attention_interval=4, vocab_size=16384,
                      rope_parameters={"type": "default", "mrope_section": [11, 11, 10],
                                       "rope_theta": 10_000_000.0,
                                       "partial_rotary_factor": 0.25,
                                       "mrope_interleaved": True}),
            vision=dict(model_type="qwen3_5", depth=6, hidden_size=768, intermediate_size=3072,
                        num_heads=12, out_hidden_size=1024, patch_size=16,
                        spatial_merge_size=2, temporal_patch_size=2,
                        num_position_embeddings=2304, in_channels=3,
                        deepstack_visual_indexes=[]),
            processor=dict(_HALF, patch_size=16, max_pixels=512 * 32 * 32)),
    },
    "gemma3_vl": {
        "tiny": dict(
            text=dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=6,
                      intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, query_pre_attn_scalar=32, sliding_window=64,
                      sliding_window_pattern=3, vocab_size=512, mm_tokens_per_image=64),
            vision=dict(model_type="siglip_vision_model", num_hidden_layers=2, hidden_size=32,
                        intermediate_size=64, num_attention_heads=2, patch_size=8,
                        image_size=128),
            processor=dict(image_size=128, tokens=64)),
        "small": dict(
            text=dict(model_type="gemma3_text", hidden_size=640, num_hidden_layers=18,
                      intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                      sliding_window_pattern=6, vocab_size=16384, mm_tokens_per_image=256),
            vision=dict(model_type="siglip_vision_model", num_hidden_layers=6,
                        hidden_size=1152, intermediate_size=4304, num_attention_heads=16,
                        patch_size=14, image_size=448),
            processor=dict(image_size=448, tokens=256)),
    },
    "gemma4_vl": {
        "tiny": dict(
            text=dict(model_type="gemma4_text", hidden_size=64, num_hidden_layers=6,
                      intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, global_head_dim=64, num_kv_shared_layers=2,
                      hidden_size_per_layer_input=16, sliding_window=64,
                      sliding_window_pattern=3, vocab_size=512,
                      vocab_size_per_layer_input=512),
            vision=dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                        head_dim=16, global_head_dim=16, patch_size=8, pooling_kernel_size=2,
                        default_output_length=64, position_embedding_size=1024),
            processor=dict(patch_size=8, max_soft_tokens=64, pooling=2)),
        "small": dict(
            text=dict(model_type="gemma4_text", hidden_size=768, num_hidden_layers=15,
                      intermediate_size=3072, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=256, global_head_dim=512, num_kv_shared_layers=5,
                      hidden_size_per_layer_input=128, sliding_window=512,
                      sliding_window_pattern=5, vocab_size=16384,
                      vocab_size_per_layer_input=16384),
            vision=dict(model_type="gemma4_vision", hidden_size=768, intermediate_size=3072,
                        num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=12,
                        head_dim=64, global_head_dim=64, patch_size=16, pooling_kernel_size=3,
                        default_output_length=280, position_embedding_size=10240),
            processor=dict(patch_size=16, max_soft_tokens=280, pooling=3)),
    },
}
