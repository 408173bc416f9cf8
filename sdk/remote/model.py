"""What a remote backend knows about its model locally: a tokenizer and the model's limits.

A remote server holds the weights; the SDK still renders node paths with the model's chat
template (to find spans, plan context and key blocks), so the tokenizer comes from a local
folder: `tokenizer=` (any model name the engine resolves, or a loaded tokenizer), else the
model name itself when it resolves locally (a folder, a GGUF, a demo or named model, LM
Studio's models folder, the Hugging Face cache; never a download: the weights are remote).
`RemoteModel` carries the attributes `Session` reads on an engine's `lm` (name, tokenizer,
fingerprint, context_length, eos_token_ids, is_vision). Knows nothing about HTTP.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkv.errors import ForkvError

__all__ = ["RemoteModel", "TokenizerNotFound", "load_remote_model"]


class TokenizerNotFound(ValueError, ForkvError):
    """The remote model's tokenizer could not be found locally."""


@dataclass(slots=True)
class RemoteModel:
    """The model a remote backend serves, as the SDK sees it (an engine's `lm`)."""

    name: str
    tokenizer: Any
    fingerprint: bytes
    context_length: int = 8192
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    is_vision: bool = False


def _folder(spec: str) -> Path:
    from forkv.engine.models.sources import resolve_source  # builds a demo model if asked for one

    try:
        return resolve_source(spec, download=False).path
    except Exception as e:  # noqa: BLE001 - re-raised as one sentence
        raise TokenizerNotFound(
            f"No local tokenizer for remote model {spec!r} ({e}); pass tokenizer= a local "
            "folder with the model's tokenizer files (or a demo: name).") from None


def _load_tokenizer(path: Path, config: dict) -> Any:
    from forkv.engine.models import blas

    blas.activate()  # before mlx (which mlx-lm imports) is loaded
    from mlx_lm.utils import load_tokenizer

    from forkv.engine.models.loader import bound_word_cache

    eos = config.get("eos_token_id")
    return bound_word_cache(load_tokenizer(path, eos_token_ids=[eos] if isinstance(eos, int)
                                           else eos))


def _config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def load_remote_model(model: str, tokenizer: Any = None, *,
                      context_length: int | None = None) -> RemoteModel:
    """The `RemoteModel` for `model` with its tokenizer (see the module docstring)."""
    config: dict = {}
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        spec = str(tokenizer) if tokenizer is not None else model
        path = _folder(spec)
        config = _config(path)
        tok = _load_tokenizer(path, config)
    else:
        tok = tokenizer
    text = config.get("text_config", config)
    limit = context_length or int(text.get("max_position_embeddings")
                                  or config.get("max_position_embeddings") or 8192)
    eos = set(getattr(tok, "eos_token_ids", None) or ())
    if not eos and getattr(tok, "eos_token_id", None) is not None:
        eos = {tok.eos_token_id}
    template = getattr(tok, "chat_template", None) or ""
    # Trees record name@fingerprint: the remote weights are not here, so the model name and
    # the chat template (what renders the tree) identify it.
    digest = hashlib.sha256(f"remote\0{model}\0{template}".encode()).digest()
    is_vision = "vision_config" in config
    return RemoteModel(model, tok, digest, limit, frozenset(eos), is_vision)
