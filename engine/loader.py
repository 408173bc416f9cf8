"""Load a model by name: any local MLX / Hugging Face-format folder, or `demo:<arch>[:<size>]`.

Returns a `LoadedModel` holding the mlx-lm model and tokenizer, the compute dtype, the cache
layout and a fingerprint that identifies (config, weights, dtype) for block keys. Never reaches
the network: a name that is not a local folder or a demo name is an error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import blas
from .demo import ARCHS, SIZES, VISION_ARCHS, ensure_demo_model
from .errors import ModelLoadError, UnknownDemoModel
from .fingerprint import fingerprint  # whole-content hash, cached by (dev, inode, size, mtime)
from .layout import CacheLayout, cache_layout

_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(slots=True)
class LoadedModel:
    name: str
    path: Path
    model: object
    tokenizer: object
    config: dict
    dtype: str
    layout: CacheLayout
    fingerprint: bytes
    context_length: int
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    # Vision models (loaded through mlx-vlm by vision_loader): `model` is the whole VLM, its
    # caches are the language model's; `processor` prepares images.
    is_vision: bool = False
    processor: object = None
    image_token_id: int | None = None

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model.language_model if self.is_vision else self.model)

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "?")


def resolve_model_path(name: str) -> Path:
    """Map a model name to a local folder, building a demo model if asked for one."""
    if name.startswith("demo:"):
        parts = name.split(":")
        if len(parts) not in (2, 3) or parts[1] not in ARCHS + VISION_ARCHS or (
            len(parts) == 3 and parts[2] not in SIZES
        ):
            raise UnknownDemoModel(
                f"Unknown demo model {name!r}; use demo:<arch>[:<size>] with arch one of "
                f"{', '.join(ARCHS + VISION_ARCHS)} and size one of {', '.join(SIZES)}."
            )
        return ensure_demo_model(parts[1], parts[2] if len(parts) == 3 else "tiny")
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelLoadError(
            f"Model folder {str(path)!r} does not exist; pass a local MLX/Hugging Face model "
            "folder or a demo name such as 'demo:gemma3'."
        )
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{str(path)!r} has no config.json; point at a model folder.")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{str(path)!r} has no .safetensors weights; convert it with mlx_lm.convert.")
    return path


def pick_dtype(requested: str, native: str) -> str:
    """On the CPU float32 is at least as fast as bfloat16 (which never uses BLAS) and exact."""
    import mlx.core as mx

    if requested not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype {requested!r}; choose one of {', '.join(_DTYPES)}.")
    if requested != "auto":
        return requested
    if mx.default_device() == mx.cpu:
        return "float32"
    return native


def load_model(name: str, dtype: str = "auto") -> LoadedModel:
    """Load a model folder or `demo:` model for the engine."""
    blas.activate()  # must precede the first mlx import to take effect
    import mlx.core as mx
    from mlx_lm.utils import load as mlx_lm_load

    path = resolve_model_path(name)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from .vision_loader import is_vision_folder

    read_config(path)  # a broken or incomplete config.json is named before mlx-lm reads it
    if is_vision_folder(path):
        return _load_vision_model(name, path, dtype)
    try:
        model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    except TypeError as e:  # ModelArgs(**config) missing a field its architecture needs
        raise ModelLoadError(_missing_fields(path, e)) from None
    except KeyError as e:
        raise ModelLoadError(f"{str(path / 'config.json')!r} lacks field {e.args[0]!r}, which "
                             "mlx-lm needs to load this model; add it from the model's "
                             "original config.json.") from None
    except (ValueError, FileNotFoundError, OSError) as e:
        raise ModelLoadError(f"Could not load model from {str(path)!r}: {e}") from e
    native = _native_dtype(model)
    chosen = pick_dtype(dtype, native)
    if chosen != native:
        model.set_dtype(getattr(mx, chosen))
    eos = tokenizer.eos_token_ids if hasattr(tokenizer, "eos_token_ids") else set()
    loaded = LoadedModel(
        name=name, path=path, model=model, tokenizer=tokenizer, config=config, dtype=chosen,
        layout=cache_layout(_make_cache(model)), fingerprint=fingerprint(path, config, chosen),
        context_length=_context_length(config), eos_token_ids=frozenset(eos or ()),
    )
    return loaded


def _load_vision_model(name: str, path: Path, dtype: str) -> LoadedModel:
    """A vision-language model: mlx-vlm loads it (vision_loader, which never imports this
    module), the rest is as for text; the fingerprint also covers the image preprocessing."""
    import hashlib

    import mlx.core as mx

    from .vision_loader import load_vision_parts

    parts = load_vision_parts(path)
    native = _native_dtype(parts.model)
    chosen = pick_dtype(dtype, native)
    if chosen != native:
        parts.model.set_dtype(getattr(mx, chosen))
    return LoadedModel(
        name=name, path=path, model=parts.model, tokenizer=parts.tokenizer, config=parts.config,
        dtype=chosen, layout=cache_layout(_make_cache(parts.model.language_model)),
        fingerprint=hashlib.sha256(fingerprint(path, parts.config, chosen)
                                   + parts.processor_digest).digest(),
        context_length=_context_length(parts.config), eos_token_ids=parts.eos_token_ids,
        is_vision=True, processor=parts.processor, image_token_id=parts.image_token_id)


def read_config(path: Path) -> dict:
    """The folder's config.json as a dict; errors name the file, where it breaks and the fix."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{str(file)!r} is not valid JSON ({e.msg} at line {e.lineno}, "
                             f"column {e.colno}); fix or replace the file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"Cannot read {str(file)!r} ({e}); check the file.") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{str(file)!r} has no \"model_type\"; it is not a model config "
                             "(use the model's original config.json).")
    return config


def _missing_fields(path: Path, e: TypeError) -> str:
    import re

    found = re.search(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)$",
                      str(e))
    what = f"field(s) {found.group(1)}" if found else f"a field ({e})"
    return (f"{str(path / 'config.json')!r} lacks {what}, which its model_type needs; add "
            "them from the model's original config.json.")


def _make_cache(model) -> list:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _native_dtype(model) -> str:
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()):
        if "float" in str(v.dtype):
            return str(v.dtype).rsplit(".", 1)[-1]
    return "float32"


def _context_length(config: dict) -> int:
    text = config.get("text_config", config)
    return int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 8192)
