"""The layers of a loaded tokenizer: mlx-lm's `TokenizerWrapper` around a transformers tokenizer
around (for a fast one) a `tokenizers.Tokenizer`.

Both outer layers also have a `_tokenizer` attribute, each naming the next layer down, and the
wrapper forwards unknown attributes to the transformers tokenizer, so `getattr` chains cannot
tell which layer they hold; these two functions can. Knows no model or request.
"""

from __future__ import annotations

from typing import Any

__all__ = ["hf_tokenizer", "raw_tokenizer"]


def hf_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer under mlx-lm's wrapper (`tokenizer` itself when it is not
    wrapped)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer


def raw_tokenizer(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` under the wrapper and a fast transformers tokenizer (or
    `tokenizer` itself if it is one); None for a tokenizer without one."""
    from tokenizers import Tokenizer

    hf = hf_tokenizer(tokenizer)
    if isinstance(hf, Tokenizer):
        return hf
    raw = getattr(hf, "backend_tokenizer", None)
    return raw if isinstance(raw, Tokenizer) else None
