"""A model's special tokens: the BOS a plain-text prompt starts with, the ids that end a run.

Plain text gets what the tokenizer prepends with `add_special_tokens=True` (Gemma's `<bos>`,
Llama's `<|begin_of_text|>`) unless the text already starts with it, as mlx-lm's `generate`
does; a base model never trained without its BOS otherwise degenerates. Chat-template text
carries its own BOS and is encoded without specials (graph/render.py, the server). The EOS ids
are the union of config.json's and generation_config.json's `eos_token_id` (an int or a list),
the tokenizer's, and the chat template's end-of-turn token (`<end_of_turn>`, `<|im_end|>`,
`<|eot_id|>`) when it is one special token. Knows tokenizers and model folders, not models.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["bos_prefix", "encode_text", "end_of_turn_id", "eos_token_ids"]

_PROBE = "a"
_ANSWER = "forkvanswer"  # a word no template trims or rewrites
_BOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bos_prefix(tokenizer: Any) -> tuple[int, ...]:
    """The ids the tokenizer puts before text when it adds special tokens (() if none);
    probed once per tokenizer. Anything it appends (an EOS on some) is left out."""
    try:
        return _BOS[tokenizer]
    except (KeyError, TypeError):
        pass
    with_ = list(tokenizer.encode(_PROBE, add_special_tokens=True))
    without = list(tokenizer.encode(_PROBE, add_special_tokens=False))
    n = len(without)
    found: tuple[int, ...] = ()
    for i in range(len(with_) - n + 1):
        if with_[i:i + n] == without:
            found = tuple(int(t) for t in with_[:i])
            break
    try:
        _BOS[tokenizer] = found
    except TypeError:  # not weak-referenceable: probe again next time (two tiny encodes)
        pass
    return found


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a plain-text prompt: the tokenizer's BOS (if it adds one and `text` does
    not already start with it), then the text."""
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    bos = list(bos_prefix(tokenizer))
    if bos and text and ids[:len(bos)] != bos:
        ids = bos + ids
    return ids


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant's answer, if it
    is one token of the vocabulary (None without a template or when it writes none)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _ANSWER}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this has no known end
        return None
    if not isinstance(text, str) or _ANSWER not in text:
        return None
    tail = text[text.rindex(_ANSWER) + len(_ANSWER):]
    ids = list(tokenizer.encode(tail, add_special_tokens=False)) if tail else []
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    token = int(ids[0])
    is_special = token in special or getattr(added.get(token), "special", False)
    return token if is_special else None


def eos_token_ids(path: Path | str | None, config: dict, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a generation (see the module docstring)."""
    found: set[int] = set()
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config.get("eos_token_id"), text.get("eos_token_id"),
                   _generation_config(path).get("eos_token_id"),
                   getattr(tokenizer, "eos_token_ids", None),
                   getattr(tokenizer, "eos_token_id", None)):
        found |= _ids(source)
    turn_end = end_of_turn_id(tokenizer)
    if turn_end is not None:
        found.add(turn_end)
    return frozenset(found)


def _generation_config(path: Path | str | None) -> dict:
    if path is None:
        return {}
    try:
        data = json.loads((Path(path) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> set[int]:
    if value is None or isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value} if value >= 0 else set()
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return {int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)
                and v >= 0}
    return set()
