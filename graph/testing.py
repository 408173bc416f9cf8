"""A toy tokenizer for tests and examples: Qwen-style chat template, byte-level tokens.

Knows just enough to stand in for a real tokenizer in `render`/`plan` without any model:
`<|im_start|>role\\n...<|im_end|>\\n` turns, reasoning kept only for assistant turns after the
last user turn (as Qwen3's template does), one `<|image_pad|>` per image. Tokens are UTF-8
bytes, with the special markers as single ids >= 256, so `decode` inverts `encode`.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ToyTokenizer"]

_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<think>", "</think>"]


class ToyTokenizer:
    """Qwen-style template + byte-level encoding. `keep_old_reasoning=True` keeps all of it."""

    def __init__(self, keep_old_reasoning: bool = False):
        self.keep_old_reasoning = keep_old_reasoning
        self.special = {s: 256 + i for i, s in enumerate(_SPECIAL)}
        self.image_token_id = self.special["<|image_pad|>"]
        self.eos_token_id = self.special["<|im_end|>"]
        self._split = re.compile("(" + "|".join(map(re.escape, _SPECIAL)) + ")")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kw: Any,
    ) -> str:
        assert not tokenize, "ToyTokenizer renders text only"
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        out = []
        for i, m in enumerate(messages):
            content = m["content"]
            if isinstance(content, list):
                content = "".join(
                    "<|image_pad|>" if p["type"] == "image" else p["text"] for p in content
                )
            reasoning = m.get("reasoning_content")
            if (
                m["role"] == "assistant"
                and reasoning is not None
                and (i > last_user or self.keep_old_reasoning)
            ):
                content = f"<think>\n{reasoning}\n</think>\n\n{content}"
            out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special:
                ids.append(self.special[piece])
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in self.special.items()}
        out, buf = [], bytearray()
        for i in ids:
            if i in names:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(names[i])
            else:
                buf.append(i)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)
