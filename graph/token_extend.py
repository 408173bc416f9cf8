"""Encoding a text that shares a prefix with one already encoded, at the cost of the new part.

Hugging Face tokenizers cut a text at its special tokens before anything else, then normalize,
pre-tokenize and merge each piece on its own, so the tokens before a special token do not
depend on what follows it: encode(text) == encode(text[:p]) + encode(text[p:]) when a special
token (not normalized) starts at p. A chat render writes one at every turn, so a turn's
render reuses its parent's tokens up to the last special token both texts share, and encodes
only what follows.

Checked, not trusted: the old tokens' tail from that special token must be what encoding the
old text from there gives, and the first uses per tokenizer are compared with a whole encode
(a mismatch turns the shortcut off for that tokenizer). Tokenizers without a `tokenizers`
backend table of added tokens always encode whole. Knows tokenizers only by duck typing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["cut_at_special", "extend_encoding", "extend_encoding_at"]

CHECKED_USES = 3  # whole-encode comparisons per tokenizer before the shortcut is trusted


@dataclass(slots=True)
class _Specials:
    content: dict[int, str]  # special token id -> its text
    longest: int  # the longest added token's text, in characters
    checks_left: int = CHECKED_USES


_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` under mlx-lm's wrapper or a transformers tokenizer."""
    for path in (("_tokenizer", "backend_tokenizer"), ("backend_tokenizer",), ("_tokenizer",)):
        obj = tokenizer
        for name in path:
            obj = getattr(obj, name, None)
        if obj is not None and hasattr(obj, "get_added_tokens_decoder"):
            return obj
    return None


def _specials(tokenizer: Any) -> _Specials | None:
    try:
        with _lock:
            if tokenizer in _tables:
                return _tables[tokenizer]
    except TypeError:  # not weak-referenceable: no shortcut
        return None
    table = None
    backend = _backend(tokenizer)
    if backend is not None:
        try:
            added = backend.get_added_tokens_decoder()
        except Exception:  # noqa: BLE001 - an unusual backend: encode whole
            added = {}
        content = {i: t.content for i, t in added.items()
                   if getattr(t, "special", False) and not getattr(t, "normalized", True)
                   and t.content}
        if content:
            table = _Specials(content, max(len(t.content) for t in added.values()))
    with _lock:
        _tables[tokenizer] = table
    return table


def cut_at_special(tokenizer: Any, text: str, tokens: Sequence[int], limit: int
                   ) -> tuple[str, Sequence[int]] | None:
    """`text` (encoded as `tokens`) cut where its last special token that starts at least
    the longest added token's length before `limit` starts: (text[:p], tokens[:i]), tokens[i]
    being that special token. Nothing before a special token depends on what follows it, so
    the pair is a text and its tokens, and a text that shares text[:limit] starts with it:
    `extend_encoding` can take it from there (and checks its tail). None where there is no
    such token or the tokenizer has no table of them."""
    table = _specials(tokenizer)
    if table is None:
        return None
    pos = len(text)
    for i in range(len(tokens) - 1, -1, -1):
        s = table.content.get(tokens[i])
        if s is not None:
            pos = text.rfind(s, 0, pos)
            if pos < 0:
                return None
            if pos + table.longest <= limit:
                return text[:pos], tokens[:i]
    return None


def extend_encoding(tokenizer: Any, encode: Callable[[str], list[int]], text: str,
                    old_text: str, old_tokens: Sequence[int]) -> list[int] | None:
    """encode(`text`) from `old_tokens` (= encode(`old_text`)) where one text starts the
    other; None where it must be encoded whole."""
    got = extend_encoding_at(tokenizer, encode, text, old_text, old_tokens)
    return None if got is None else got[0]


def extend_encoding_at(tokenizer: Any, encode: Callable[[str], list[int]], text: str,
                       old_text: str, old_tokens: Sequence[int]
                       ) -> tuple[list[int], int] | None:
    """`extend_encoding`, with how many of its first tokens are `old_tokens`' first ones as
    they were taken (0 where it was encoded whole to check the shortcut)."""
    if text.startswith(old_text):
        shared = len(old_text)
    elif old_text.startswith(text):
        shared = len(text)
    else:
        return None
    table = _specials(tokenizer)
    if table is None:
        return None
    pos, i = len(old_text), len(old_tokens) - 1
    while i >= 0:  # back over the old tokens to the last special token inside the shared text
        s = table.content.get(old_tokens[i])
        if s is not None:
            pos = old_text.rfind(s, 0, pos)
            if pos < 0:
                return None
            if pos + table.longest <= shared:  # no added token can straddle it
                break
        i -= 1
    if i < 0 or encode(old_text[pos:]) != list(old_tokens[i:]):
        return None
    out = old_tokens[:i]  # (a list's slice is a new list; an array's is converted)
    if not isinstance(out, list):
        out = list(out)
    out += encode(text[pos:])  # (in place: one copy of a deep path's tokens, not two)
    if table.checks_left > 0:
        whole = encode(text)
        with _lock:
            table.checks_left -= 1
            if whole != out:  # this tokenizer does not cut at its special tokens: stop
                _tables[tokenizer] = None
        return whole, 0
    return out, i
