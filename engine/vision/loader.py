"""Load a vision-language model folder through mlx-vlm (the optional `vision` extra), and pick
the model's vision family.

A folder is a vision model when its config has a `vision_config`. `load_vision_parts` gives
what models/loader.py turns into a `LoadedModel` (`is_vision=True`): the mlx-vlm model, its
processor, tokenizer, image token id and a digest of the image preprocessing settings (they change
what an image's tokens mean, so the fingerprint covers them). mlx-vlm 0.7 ships its own copies of
mlx-lm's cache classes; the engine's cache layout, records and batch caches know mlx-lm's, so
the language model is made to build mlx-lm's K/V caches (same layout); other caches stay.
`family_for` gives the `VisionFamily` (family.py) of a loaded model. This is the only module
that imports mlx-vlm; it never imports models/loader.py (which imports it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from .family import VisionFamily
from .gemma import Gemma3Family, Gemma4Family
from .qwen import QwenFamily

FAMILIES: dict[str, type[VisionFamily]] = {
    t: cls for cls in (QwenFamily, Gemma3Family, Gemma4Family) for t in cls.model_types}
SUPPORTED = tuple(FAMILIES)
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.json")


@dataclass(slots=True)
class VisionParts:
    model: object
    processor: object
    tokenizer: object
    config: dict
    eos_token_ids: frozenset[int]
    image_token_id: int
    processor_digest: bytes


def is_vision_folder(path: Path) -> bool:
    try:
        return "vision_config" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def family_for(lm) -> VisionFamily:
    """The vision family of a loaded vision model."""
    return FAMILIES[lm.config["model_type"]](lm)


def _import_mlx_vlm():
    try:
        import mlx_vlm.utils
    except ImportError as e:
        raise ModelLoadError(
            "This is a vision model, which needs mlx-vlm; install forkv's vision extra "
            "(pip install 'forkv[vision]')."
        ) from e
    return mlx_vlm.utils


def load_vision_parts(path: Path) -> VisionParts:
    """Load `path` (a local VLM folder) with mlx-vlm."""
    from mlx_lm.tokenizer_utils import load as mlx_lm_load

    from ..models.loader import keep_tokenizer
    from ..models.tokenizer_load import load_tokenizer

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
    _use_mlx_lm_caches(model.language_model)
    eos = config.get("eos_token_id", config.get("text_config", {}).get("eos_token_id"))
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    # mlx-lm's tokenizer wrapper gives the engine the same streaming detokenizer as for text.
    tokenizer = keep_tokenizer(load_tokenizer(path, eos_token_ids=eos or None,
                                              loader=mlx_lm_load))
    _share_tokenizer(processor, tokenizer)
    image_token = config.get("image_token_id", config.get("image_token_index"))
    return VisionParts(
        model=model, processor=processor, tokenizer=tokenizer, config=config,
        eos_token_ids=frozenset(eos or getattr(tokenizer, "eos_token_ids", ()) or ()),
        image_token_id=int(image_token), processor_digest=_processor_digest(path))


def _share_tokenizer(processor, wrapper) -> None:
    """Give `processor` the tokenizer mlx-lm's wrapper loaded from the same folder, where they
    are the same class, words and settings: two copies of a 262K-word tokenizer are ~110 MiB
    each. (mlx-vlm's Gemma 4 processor adds a word to its own: that one keeps its copy.)"""
    own, loaded = getattr(processor, "tokenizer", None), getattr(wrapper, "_tokenizer", None)
    if own is None or loaded is None or type(own) is not type(loaded) or len(own) != len(loaded):
        return
    # mlx-lm notes its tool parser in the settings, and the processor how it was loaded
    ignore = ("tool_parser_type", "local_files_only")
    if ({k: v for k, v in own.init_kwargs.items() if k not in ignore}
            == {k: v for k, v in loaded.init_kwargs.items() if k not in ignore}):
        processor.tokenizer = loaded


def _use_mlx_lm_caches(language_model) -> None:
    """Make `language_model.make_cache()` return mlx-lm's cache classes (see the docstring)."""
    from mlx_lm.models import cache as lm_cache

    own = getattr(language_model, "make_cache", None)
    if own is None:
        return  # mlx-lm's make_prompt_cache builds KVCaches for it

    def convert(c):
        name = type(c).__name__
        if name == "KVCache":
            return lm_cache.KVCache()
        if name == "RotatingKVCache":
            return lm_cache.RotatingKVCache(max_size=c.max_size, keep=c.keep)
        # Anything else stays mlx-vlm's: qwen3_5's gated-delta layers need its ArraysCache
        # (window updates); the layout decides whether it can be checkpointed.
        return c

    language_model.make_cache = lambda: [convert(c) for c in own()]


def _processor_digest(path: Path) -> bytes:
    h = hashlib.sha256(b"forkv-vision-processor-v1")
    for name in _PROCESSOR_FILES:
        f = path / name
        h.update(f"{name}:".encode() + (f.read_bytes() if f.is_file() else b"-"))
    return h.digest()
