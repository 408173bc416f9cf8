"""Built-in demo vision models: random-weight instances of mlx-vlm's `qwen2_vl`, `qwen3_5`,
`gemma3` and `gemma4` vision-language models.

`demo_vlm_config(arch, size)` gives the config.json and `build_vlm(config, folder, seed)` writes
a normal Hugging Face-style folder — weights, our byte-level tokenizer plus the family's vision
special tokens, a chat template that renders image parts the family's way, and a
`preprocessor_config.json` — so `mlx_vlm.load(folder)` works offline. mlx-vlm is imported only
while building. Knows nothing about generation; `demo.ensure_demo_model` decides where folders
live (this module never imports models.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from .tokenizer import (EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TOOL_FORMATS,
                        chat_template as text_template, special_token_id)
from .vlm_specs import FAMILIES, MODEL_TYPES, SPECS
from .weights import save_random_model

DEMO_VLM_VERSION = 4
VISION_ARCHS = tuple(SPECS)
_IMAGE_PART = "{{- '<image>' -}}"


def _model_type(arch: str) -> str:
    """mlx-vlm model type of a demo name (a model type passes through)."""
    return MODEL_TYPES.get(arch, arch)


def vision_token_id(arch: str, name: str) -> int:
    """Id of one of the family's vision tokens (numbered after the text demo's specials)."""
    return 256 + len(SPECIAL_TOKENS) + FAMILIES[_model_type(arch)]["tokens"].index(name)


def chat_template(arch: str) -> str:
    model_type = _model_type(arch)
    text = text_template(TOOL_FORMATS.get(model_type, "json_tools"))  # the family's tools
    template = text.replace(_IMAGE_PART, "{{- '%s' -}}" % FAMILIES[model_type]["image_part"])
    assert template != text, "the text template no longer renders image parts"
    return template


def demo_vlm_config(arch: str, size: str) -> dict:
    """The full config.json of a demo VLM."""
    model_type = _model_type(arch)
    spec, family = SPECS[arch][size], FAMILIES[model_type]
    ids = {name: vision_token_id(arch, token) for name, token in family["ids"].items()}
    eos, pad = special_token_id(EOS_TOKEN), special_token_id(PAD_TOKEN)
    text = dict(spec["text"], rms_norm_eps=1e-6, max_position_embeddings=131072,
                tie_word_embeddings=True, eos_token_id=eos)
    vision = dict(spec["vision"])
    if model_type == "qwen2_vl":  # Qwen2-VL's layout: text fields at the top level
        config = dict(text, model_type=model_type, rope_theta=1_000_000.0, bos_token_id=pad,
                      vision_config=dict(vision, model_type=model_type,
                                         hidden_size=text["hidden_size"]))
    else:
        config = dict(model_type=model_type, text_config=text, vision_config=vision,
                      eos_token_id=eos, tie_word_embeddings=True, pad_token_id=pad)
    if model_type == "gemma3":
        config.update(hidden_size=text["hidden_size"], vocab_size=text["vocab_size"],
                      mm_tokens_per_image=text["mm_tokens_per_image"])
    if model_type == "gemma4":
        config.update(hidden_size=text["hidden_size"], vocab_size=text["vocab_size"],
                      vision_soft_tokens_per_image=spec["processor"]["max_soft_tokens"])
    return dict(config, **ids, forkv_demo=f"{arch}:{size}:v{DEMO_VLM_VERSION}",
                forkv_processor=spec["processor"])


def build_vlm(config: dict, folder: Path, seed: int) -> None:
    """Write weights, tokenizer, chat template and processor configs into `folder`."""
    import mlx.core as mx
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    arch = config["model_type"]
    num_tokens = _write_tokenizer(folder, arch)
    text = config.get("text_config", config)
    assert text["vocab_size"] >= num_tokens
    module, _ = get_model_and_args(dict(config))
    # What mlx_vlm.load_model does with a config.json.
    full = json.loads(json.dumps(config))
    if arch == "qwen2_vl":
        full["text_config"] = dict(config)
    model_config = update_module_configs(module.ModelConfig.from_dict(full), module, full,
                                         ["text", "vision"])
    mx.random.seed(seed)
    model = module.Model(model_config)
    if arch == "gemma3":
        # mlx-vlm initialises Gemma 3's projection to ones, which sums the (zero-mean) tower
        # output to ~0: image tokens would carry only rounding noise.
        proj = model.multi_modal_projector
        shape = proj.mm_input_projection_weight.shape
        proj.mm_input_projection_weight = mx.random.normal(shape) * shape[0] ** -0.5
    # Damp only the tied text embeddings ("embed" alone would also hit the patch embedders).
    save_random_model(model, config, folder, damp="embed_tokens")
    (folder / "preprocessor_config.json").write_text(json.dumps(
        _processor_config(arch, config["forkv_processor"]), indent=2))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": chat_template(arch)}))
    if arch == "gemma3":  # Gemma3Processor's own settings: image tokens per image
        (folder / "processor_config.json").write_text(json.dumps({
            "processor_class": "Gemma3Processor",
            "image_seq_length": config["forkv_processor"]["tokens"]}))


def _processor_config(arch: str, p: dict) -> dict:
    if arch in ("qwen2_vl", "qwen3_5"):
        processor = "Qwen2VLProcessor" if arch == "qwen2_vl" else "Qwen3VLProcessor"
        return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": processor,
                "patch_size": p["patch_size"], "temporal_patch_size": 2, "merge_size": 2,
                "min_pixels": 4 * (2 * p["patch_size"]) ** 2, "max_pixels": p["max_pixels"],
                "image_mean": p["mean"], "image_std": p["std"]}
    if arch == "gemma3":
        return {"image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "do_resize": True, "size": {"height": p["image_size"], "width": p["image_size"]},
                "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "do_pan_and_scan": False, "image_seq_length": p["tokens"]}
    return {"processor_class": "Gemma4Processor", "patch_size": p["patch_size"],
            "max_soft_tokens": p["max_soft_tokens"], "pooling_kernel_size": p["pooling"],
            "do_resize": True, "do_rescale": True, "do_normalize": False}


def _write_tokenizer(folder: Path, arch: str) -> int:
    """The text demos' byte-level tokenizer plus the family's vision tokens and template."""
    from tokenizers import Tokenizer

    from .tokenizer import write_tokenizer

    family = FAMILIES[arch]
    write_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(family["tokens"])
    tok.save(str(folder / "tokenizer.json"))
    assert all(tok.token_to_id(t) == vision_token_id(arch, t) for t in family["tokens"])
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = chat_template(arch)
    # Processors read the image tokens off the tokenizer (tokenizer.boi_token, ...).
    if family.get("named"):
        config["extra_special_tokens"] = family["named"]
        config.update(family["named"])
    config_path.write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()
