"""Built-in demo models: tiny, randomly initialised instances of real mlx-lm architectures.

`ensure_demo_model("gemma3", "tiny")` builds (once, deterministically, offline) a normal model
folder — config.json, model.safetensors, tokenizer files — under the user's cache folder and
returns its path; `mlx_lm.load` reads it like any other. Knows nothing about generation.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import UnknownDemoModel
from .tokenizer import EOS_TOKEN, TOOL_FORMATS, chat_template, special_token_id, write_tokenizer
from .weights import save_random_model
# Vision demos (mlx-vlm architectures) live in vlm.py, which never imports this module.
from .vlm import VISION_ARCHS, build_vlm, demo_vlm_config
# cache_root moved to paths; importing it from here keeps working.
from ..paths import cache_root, staged_folder

DEMO_VERSION = 1
SIZES = ("tiny", "small")

# `tiny` is for tests (loads and prefills 1K tokens in well under a second); `small` is shaped
# like the real checkpoints (layer pattern, head layout, widths) so compute and cache sizes are
# representative. Vocab is cut to keep the LM head from dominating, which only makes full
# recompute cheaper and so our restore speedups conservative.
_CONFIGS: dict[str, dict[str, dict]] = {
    "qwen3": {
        "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512),
        # Qwen3-0.6B's head layout at about half its depth.
        "small": dict(hidden_size=1024, num_hidden_layers=14, intermediate_size=3072,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      vocab_size=16384),
    },
    "gemma3": {
        "tiny": dict(hidden_size=64, num_hidden_layers=6, intermediate_size=128,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                     query_pre_attn_scalar=32, sliding_window=128, sliding_window_pattern=3,
                     vocab_size=512),
        # Gemma-3-270M: 18 layers, 5 local : 1 global, window 512.
        "small": dict(hidden_size=640, num_hidden_layers=18, intermediate_size=2048,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                      query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
                      vocab_size=16384),
    },
    "gemma4": {
        "tiny": dict(hidden_size=64, num_hidden_layers=6, intermediate_size=128,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                     global_head_dim=64, num_kv_shared_layers=2, hidden_size_per_layer_input=16,
                     sliding_window=128, sliding_window_pattern=3, vocab_size=512,
                     vocab_size_per_layer_input=512),
        "small": dict(hidden_size=768, num_hidden_layers=15, intermediate_size=3072,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                      global_head_dim=512, num_kv_shared_layers=5,
                      hidden_size_per_layer_input=128, sliding_window=512,
                      sliding_window_pattern=5, vocab_size=16384,
                      vocab_size_per_layer_input=16384),
    },
    "qwen3_5": {
        "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=16, full_attention_interval=2, vocab_size=512),
        # Qwen3.5-0.8B's 3 linear : 1 global pattern, widths and head layout, 8 of its 24
        # layers (mlx-lm's CPU gated-delta path steps through time in Python: depth costs).
        "small": dict(hidden_size=1024, num_hidden_layers=8, intermediate_size=3072,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                      linear_num_key_heads=16, linear_num_value_heads=16,
                      linear_key_head_dim=128, linear_value_head_dim=128,
                      full_attention_interval=4, vocab_size=16384),
    },
}

_MODEL_TYPES = {"qwen3": "qwen3", "gemma3": "gemma3_text", "gemma4": "gemma4_text",
                "qwen3_5": "qwen3_5"}
ARCHS = tuple(_CONFIGS)  # text-only (mlx-lm) architectures; VISION_ARCHS are mlx-vlm ones


def demo_config(arch: str, size: str) -> dict:
    """The full config.json for a demo model."""
    if arch not in _CONFIGS or size not in SIZES:
        raise UnknownDemoModel(
            f"Unknown demo model 'demo:{arch}:{size}'; choose an arch from {', '.join(ARCHS)} "
            f"and a size from {', '.join(SIZES)}."
        )
    eos = special_token_id(EOS_TOKEN)
    params = dict(_CONFIGS[arch][size])
    base = dict(model_type=_MODEL_TYPES[arch], rms_norm_eps=1e-6, tie_word_embeddings=True,
                max_position_embeddings=131072, eos_token_id=eos)
    if arch == "qwen3_5":
        text = dict(base, **params, model_type="qwen3_5_text")
        return dict(model_type="qwen3_5", text_config=text, eos_token_id=eos,
                    tie_word_embeddings=True, forkv_demo=f"{arch}:{size}:v{DEMO_VERSION}")
    if arch == "qwen3":
        base["rope_theta"] = 1_000_000.0
    return dict(base, **params, forkv_demo=f"{arch}:{size}:v{DEMO_VERSION}")


def ensure_demo_model(arch: str, size: str = "tiny") -> Path:
    """Return the folder of a demo model, building it first if it is not there yet."""
    if arch in VISION_ARCHS and arch not in _CONFIGS and size in SIZES:  # text names win
        config, build = demo_vlm_config(arch, size), build_vlm
    else:
        config, build = demo_config(arch, size), _build
    # The folder name carries a digest of the config, so a changed config never reuses
    # weights built for an old one.
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
    folder = cache_root() / "demo" / f"{arch}-{size}-{digest}"
    if (folder / "model.safetensors").exists():
        from .vlm import chat_template as vlm_template

        _refresh_template(folder, chat_template(TOOL_FORMATS[arch]) if build is _build
                          else vlm_template(arch))
        return folder
    return build_atomically(folder, lambda tmp: build(config, tmp,
                                                      seed=sum(map(ord, f"{arch}:{size}"))))


def build_atomically(folder: Path, write) -> Path:
    """`write(tmp)` a model into a fresh folder beside `folder`, then rename it to `folder`, so
    a crash never leaves half a model (and a concurrent builder that wins the rename is fine)."""
    with staged_folder(folder, done=lambda f: (f / "model.safetensors").exists()) as tmp:
        tmp.mkdir(mode=0o700)
        write(tmp)
    return folder


def _refresh_template(folder: Path, template: str) -> None:
    """Give a folder built by an older forkv the current chat template (tools were added
    later); the template is not part of the model's fingerprint, so checkpoints stay valid."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    if config.get("chat_template") == template:
        return
    config["chat_template"] = template
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer_config-", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(config, indent=2))
    os.replace(tmp, path)  # atomic: a concurrent load sees the old file or the new one


def _build(config: dict, folder: Path, seed: int) -> None:
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    arch = config["forkv_demo"].split(":")[0]
    num_tokens = write_tokenizer(folder, chat_template(TOOL_FORMATS[arch]))
    text = config.get("text_config", config)
    assert text["vocab_size"] >= num_tokens
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    save_random_model(model_class(args_class.from_dict(config)), config, folder, damp="embed")

