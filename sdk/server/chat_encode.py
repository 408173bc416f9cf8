"""A chat completion's prompt tokens at the cost of its new messages.

A chat client sends the whole conversation with every request, and encoding all of it again
took ~28 ms of a 16K-token request's time to first token on Gemma 3 (the chat template's
Jinja render 0.7 ms of that; the tokenizer the rest). So each namespace keeps its
last two renders (text and tokens), and a render that shares a prefix with one of them (the
next turn, a regeneration, a rewind to an earlier turn or an edit of it) encodes only what
follows the last special token inside that prefix (`forkv.graph.token_extend`, as the graph's
renders do: the kept tokens' tail is re-encoded and compared every time, and a tokenizer's
first uses are checked against a whole encode). Per namespace: one tenant's request never
extends another's text, whose shorter encode would tell it that text. In memory only,
bounded by tokens; prompts with images never come here (the vision runner renders them).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from forkv.engine.models.chat_template import require_chat_template
from forkv.graph.token_extend import cut_at_special, extend_encoding

__all__ = ["ChatEncodings"]

PER_NAMESPACE = 2  # renders kept per namespace: the last request, and one before it
MAX_TOKENS = 1 << 18  # tokens kept in all (1 MiB of ids, and their text: ~1 MB of English)


def _shared(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (slices compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ChatEncodings:
    """The prompt tokens of chat messages for one loaded model, as `Engine.encode` gives them
    (the template's render with the generation prompt, encoded without added specials)."""

    def __init__(self, tokenizer, model_name: str, per_namespace: int = PER_NAMESPACE,
                 max_tokens: int = MAX_TOKENS):
        self.tokenizer, self.model_name = tokenizer, model_name
        self.per_namespace, self.max_tokens = per_namespace, max_tokens
        # namespace -> its renders, oldest first; namespaces least recently used first
        self._kept: OrderedDict[str, list[tuple[str, array]]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def encode(self, messages: Sequence[dict], namespace: str) -> list[int]:
        tok = self.tokenizer
        require_chat_template(tok, self.model_name)
        text = tok.apply_chat_template(list(messages), tokenize=False,
                                       add_generation_prompt=True)
        tokens = None
        best = max(((_shared(text, old), old, toks) for old, toks in self._candidates(namespace)),
                   key=lambda c: c[0], default=None)
        if best is not None and best[0]:
            shared, old_text, old_tokens = best
            if shared < min(len(text), len(old_text)):  # a branch (a rewind, an edit): cut the
                cut = cut_at_special(tok, old_text, old_tokens, shared)  # old render back to
                old_text, old_tokens = cut if cut is not None else ("", ())  # what both share
            if old_text:
                tokens = extend_encoding(tok, self._encode, text, old_text, old_tokens)
        if tokens is None:
            tokens = self._encode(text)
        self._keep(namespace, text, tokens)
        return tokens

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _candidates(self, namespace: str) -> list[tuple[str, array]]:
        """The namespace's kept renders, newest first."""
        with self._lock:
            return list(reversed(self._kept.get(namespace, ())))

    def _keep(self, namespace: str, text: str, tokens: list[int]) -> None:
        if len(tokens) > self.max_tokens:
            return
        with self._lock:
            kept = self._kept.pop(namespace, [])
            for old in [e for e in kept if e[0] == text]:  # (the same prompt again)
                kept.remove(old)
                self._tokens -= len(old[1])
            kept.append((text, array("i", tokens)))
            self._tokens += len(tokens)
            while len(kept) > self.per_namespace:
                self._tokens -= len(kept.pop(0)[1])
            self._kept[namespace] = kept
            while self._tokens > self.max_tokens:  # the least recently used namespace's oldest
                ns, oldest = next(iter(self._kept.items()))
                self._tokens -= len(oldest.pop(0)[1])
                if not oldest:
                    del self._kept[ns]
