"""Load a vision-language model folder through mlx-vlm (the optional `vision` extra).

A folder is a vision model when its config has a `vision_config`. The result is a normal
`LoadedModel` with `is_vision=True`, the mlx-vlm model, its processor and image token id; the
cache layout comes from the language model's caches, as for text models. The fingerprint also
covers the image preprocessing settings, since they change what an image's tokens mean. This is
the only module that imports mlx-vlm.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import ModelLoadError

# Architectures whose position state and image layout forkv.engine.vision knows.
SUPPORTED = ("qwen2_vl",)
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.json")


def is_vision_folder(path: Path) -> bool:
    try:
        return "vision_config" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def _import_mlx_vlm():
    try:
        import mlx_vlm.utils
    except ImportError as e:
        raise ModelLoadError(
            "This is a vision model, which needs mlx-vlm; install forkv's vision extra "
            "(pip install 'forkv[vision]')."
        ) from e
    return mlx_vlm.utils


def load_vision_model(name: str, path: Path, dtype: str = "auto"):
    """Load `path` (a local VLM folder) for the engine."""
    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from .layout import cache_layout
    from .loader import LoadedModel, _context_length, _native_dtype, pick_dtype

    vlm = _import_mlx_vlm()
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") not in SUPPORTED:
        raise ModelLoadError(
            f"forkv cannot run vision model type {config.get('model_type')!r} yet; supported: "
            f"{', '.join(SUPPORTED)}.")
    try:
        model = vlm.load_model(path)
        processor = vlm.load_processor(path, add_detokenizer=False)
    except (ValueError, TypeError, KeyError, OSError) as e:
        raise ModelLoadError(f"Could not load vision model from {str(path)!r}: {e}") from e
    native = _native_dtype(model)
    chosen = pick_dtype(dtype, native)
    if chosen != native:
        model.set_dtype(getattr(mx, chosen))
    eos = config.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    # mlx-lm's tokenizer wrapper gives the engine the same streaming detokenizer as for text.
    tokenizer = load_tokenizer(path, eos_token_ids=eos or None)
    caches = _language_caches(model)
    return LoadedModel(
        name=name, path=path, model=model, tokenizer=tokenizer, config=config, dtype=chosen,
        layout=cache_layout(caches), fingerprint=_fingerprint(path, config, chosen),
        context_length=_context_length(config),
        eos_token_ids=frozenset(eos or getattr(tokenizer, "eos_token_ids", ()) or ()),
        is_vision=True, processor=processor, image_token_id=int(config["image_token_id"]),
    )


def _language_caches(model) -> list:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model.language_model)


def _fingerprint(path: Path, config: dict, dtype: str) -> bytes:
    from .loader import fingerprint

    h = hashlib.sha256(fingerprint(path, config, dtype))
    for name in _PROCESSOR_FILES:
        f = path / name
        h.update(f"{name}:".encode() + (f.read_bytes() if f.is_file() else b"-"))
    return h.digest()
