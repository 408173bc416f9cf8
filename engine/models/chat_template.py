"""A model's chat template: whether it has one, one the user gives, and the error without one.

Base models (Gemma 3 270M, most pretrained checkpoints) ship no chat template, so chat messages
cannot be rendered for them; plain text still works. `use_chat_template(lm, template)` gives a
loaded model one on its tokenizer, so every renderer (the engine, the graph, the server, the
turn-end marker) sees the same template, and adds the template's end-of-turn token to the
model's EOS ids. Templates come as Jinja text, a `.jinja` file or a `chat_template.json`.
Knows tokenizers and `LoadedModel` fields, not engines or requests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError, NoChatTemplate
from .special_tokens import end_of_turn_id

__all__ = ["has_chat_template", "read_chat_template", "require_chat_template",
           "use_chat_template"]


def has_chat_template(tokenizer: Any) -> bool:
    """True when `tokenizer` can render chat messages (a template, or mlx-lm's own renderer)."""
    return bool(getattr(tokenizer, "chat_template", None)) or (
        getattr(tokenizer, "_chat_template", None) is not None)


def require_chat_template(tokenizer: Any, model: str) -> None:
    """A `NoChatTemplate` error unless `tokenizer` can render chat messages."""
    if not has_chat_template(tokenizer):
        raise NoChatTemplate(
            f"Model {model!r} has no chat template, so it cannot take chat messages; give "
            "one (chat_template= in Python, --chat-template FILE on the command line) or "
            "send plain text instead.")


def read_chat_template(source: str | os.PathLike) -> str:
    """The template of `source`: Jinja text, or a path to a `.jinja` file or to a
    `chat_template.json` / `tokenizer_config.json` holding a "chat_template" string."""
    if isinstance(source, str) and ("{{" in source or "{%" in source):
        return source
    path = Path(source).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"Cannot read the chat template {str(path)!r} ({e}); pass a Jinja "
                             "file or a chat_template.json.") from None
    if path.suffix == ".json":
        try:
            text = json.loads(text).get("chat_template")
        except (ValueError, AttributeError):
            text = None
        if not isinstance(text, str) or not text:
            raise ModelLoadError(f"{str(path)!r} holds no \"chat_template\" string; pass a "
                                 "Jinja file or a JSON file with that key.")
    if not text.strip():
        raise ModelLoadError(f"The chat template {str(path)!r} is empty; pass a Jinja template.")
    return text


def use_chat_template(lm: Any, template: str | os.PathLike) -> None:
    """Make `template` (text or a file, see `read_chat_template`) the chat template of the
    loaded model `lm` (on its tokenizer, so engines sharing `lm` share it) and add its
    end-of-turn token to `lm.eos_token_ids`."""
    text = read_chat_template(template)
    tok = lm.tokenizer
    old = getattr(tok, "chat_template", None)
    tok.chat_template = text
    if getattr(tok, "_chat_template", None) is not None:
        tok._chat_template = None  # mlx-lm's built-in renderer would shadow the given one
    try:
        tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - any template error is the user's to fix
        tok.chat_template = old
        raise ModelLoadError(f"The chat template does not render a user message "
                             f"({type(e).__name__}: {e}); fix the template.") from None
    turn_end = end_of_turn_id(tok)
    if turn_end is not None:
        lm.eos_token_ids = frozenset(lm.eos_token_ids) | {turn_end}
        if hasattr(tok, "eos_token_ids"):
            tok.eos_token_ids = set(tok.eos_token_ids or ()) | {turn_end}
