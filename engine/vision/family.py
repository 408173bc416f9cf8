"""What forkv must know about one family of vision-language models, and which family a model is.

A `VisionFamily` (one per loaded model) covers what differs between mlx-vlm's VLMs:
- prompts: the token the chat template renders per image, the text around the image's tokens,
  and how many tokens an image takes (`placeholder_id`, `wrap`, `layout`);
- the tower: preprocess an image and turn it into language-model features (`preprocess`,
  `encode`), through mlx-vlm's own modules;
- running: one forward of the language model over a chunk whose image tokens take the given
  features (`forward`), one batched decode step (`decode`), and the per-request position
  state (`positions`): plain token positions for Gemma, M-RoPE for Qwen (qwen.py).
loader.py picks the family by mlx-vlm model type. Knows nothing about keys, checkpoints
or the feature cache (support.py), and imports neither mlx-vlm nor the families.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Positions:
    """Position state of one request where positions are token indices (no state beyond the
    token count): what a restore needs is the restored point itself."""

    def __init__(self, num_prompt: int):
        self.num_prompt = num_prompt

    def state_at(self, pos: int) -> int:
        """The number stored with the checkpoint at boundary `pos` (see ckpt.py)."""
        return pos

    def ids(self, first: int, n: int) -> np.ndarray | None:
        """Explicit position ids for tokens [first, first+n), or None (the cache offset)."""
        return None


class VisionFamily:
    """Base: the family-neutral parts; subclasses fill in the rest (see the module docstring)."""

    model_types: tuple[str, ...] = ()

    def __init__(self, lm):
        self.lm = lm
        self.model = lm.model
        self.config = lm.config
        self.language_model = lm.model.language_model
        self.image_token_id = int(lm.image_token_id)
        self.placeholder_id = self.image_token_id

    # -- prompts ------------------------------------------------------------------------------
    def wrap(self, tokenizer) -> tuple[Sequence[int], Sequence[int]]:
        """Tokens before and after an image's own tokens."""
        return (), ()

    def num_tokens(self, grid: tuple[int, int, int]) -> int:
        raise NotImplementedError

    # -- the tower ----------------------------------------------------------------------------
    def preprocess(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """(pixels, grid) of a decoded RGB image."""
        raise NotImplementedError

    def encode(self, pixels: np.ndarray, grid: tuple[int, int, int]):
        """Language-model features (n_tokens, hidden) of one image."""
        raise NotImplementedError

    @property
    def embed_dtype(self):
        return self.language_model.model.embed_tokens.weight.dtype

    # -- running ------------------------------------------------------------------------------
    def positions(self, request, start: int, state: int, lo: int) -> Positions:
        """The position state of `request` from token `lo` on, given the stored state at
        `start` (>= lo, the restored point)."""
        return Positions(len(request.tokens))

    def forward(self, ids, cache, spans: list, positions: np.ndarray | None):
        """Logits of the chunk `ids` (1, n); `spans` lists (a, b, features): the chunk's tokens
        [a, b) are image tokens and take `features` (b - a, hidden), in order."""
        raise NotImplementedError

    def decode(self, seqs, offsets: list[int], inputs, caches):
        """One batched decode step of rows at token indices `offsets` (see support.py)."""
        return self.language_model(inputs, cache=caches).logits


def splice(text, spans: list):
    """Text embeddings (1, n, hidden) with the image spans' features in place."""
    import mlx.core as mx

    if not spans:
        return text
    parts, i = [], 0
    for a, b, features in spans:
        if i < a:
            parts.append(text[:, i:a])
        parts.append(features[None].astype(text.dtype))
        i = b
    if i < text.shape[1]:
        parts.append(text[:, i:])
    return mx.concatenate(parts, axis=1)
