"""Vision requests on the engine: render images into the prompt, run the tower once per image,
and drive the language model with image features and the family's positions.

`VisionSupport` (one per engine, on vision models only) renders prompts, owns the feature cache,
makes each request's model callable (`sequence`; the prefix cache restores it) and decodes
rows (`decode_rows`).
`VisionSequence` is the model callable for one request: given any range of the sequence (a
prefill chunk, a recomputed decoded block) it fetches the features of the images the range
overlaps and has the model family (family.py: Gemma, Qwen) run the language model on
it, at the positions the family's per-request position state gives. That state is restored
from the checkpoint (see ckpt.py), so a restore needs nothing about the images before
it. Chunks are also cut at every image end, in every run, so a checkpoint may sit right after
an image. Text-only requests on a vision model take the same path (no images), so they share
one continuous batch with image requests. Knows nothing about keys or stores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import GenerationError
from ..request.generate import run_pieces
from .features import DEFAULT_FEATURE_BYTES, FeatureCache
from .images import ImageInput, ImageSlot, VisionPrompt, render_prompt


@dataclass(slots=True)
class VisionStats:
    requests: int = 0
    images: int = 0
    preprocess_s: float = 0.0  # decoding, resizing and patchifying images
    tail_restores: int = 0  # restores that ended right after an image (ckpt.py)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class VisionSupport:
    """Image rendering, the vision tower and the feature cache for one vision model."""

    def __init__(self, lm, feature_bytes: int = DEFAULT_FEATURE_BYTES):
        if not getattr(lm, "is_vision", False):
            raise GenerationError(
                f"Model {lm.name!r} is text-only and cannot take images; load a vision model "
                "such as 'demo:qwen2_vl' (pip install 'forkv[vision]'), or drop the images.")
        from .loader import family_for

        self.lm = lm
        self.family = family_for(lm)
        self.features = FeatureCache(feature_bytes)
        self.stats = VisionStats()
        self._wrap = self.family.wrap(lm.tokenizer)

    def render(self, prompt, images=None) -> VisionPrompt:
        pixels: dict[bytes, np.ndarray] = {}

        def image_tokens(image: ImageInput):
            grid = self.features.grid(image.digest)
            if grid is None:
                pixels[image.digest], grid = self._preprocess(image)
            return grid, self.family.num_tokens(grid)

        request = render_prompt(self.lm.tokenizer, prompt, images, self.family.placeholder_id,
                                image_tokens, self.family.image_token_id, self._wrap)
        request.pixels = pixels
        self.stats.requests += 1
        self.stats.images += len(request.images)
        return request

    def sequence(self, request: VisionPrompt, start: int = 0, state: int = 0,
                 lo: int | None = None) -> VisionSequence:
        """The model callable of `request` from `start` tokens at position state `state` (see
        `VisionSequence`)."""
        return VisionSequence(self, request, start, state, lo)

    def decode_rows(self, seqs: list[VisionSequence], offsets: list[int], inputs, caches):
        """One batched decode step: row i feeds `inputs[i]`, a generated token at index
        `offsets[i]` of its sequence, through merged (mlx-lm batch) caches, each row at its own
        position. For a continuous-batching scheduler; returns (rows, 1, vocab)."""
        return self.family.decode(seqs, offsets, inputs, caches)

    def features_of(self, slot: ImageSlot, request: VisionPrompt):
        """The image's features (n_tokens, hidden): from the cache, else from the tower."""
        import mlx.core as mx

        digest = slot.image.digest
        features = self.features.get(digest)
        if features is not None:
            return features
        pixels = request.pixels.get(digest)
        if pixels is None:  # its grid was known, its features were evicted
            pixels, _ = self._preprocess(slot.image)
        t0 = time.perf_counter()
        features = self.family.encode(pixels, slot.grid)
        mx.eval(features)
        self.features.stats.tower_runs += 1
        self.features.stats.tower_s += time.perf_counter() - t0
        self.features.put(digest, features)
        return features

    def _preprocess(self, image: ImageInput) -> tuple[np.ndarray, tuple[int, int, int]]:
        t0 = time.perf_counter()
        pixels, grid = self.family.preprocess(image.load())
        self.features.put_grid(image.digest, grid)
        self.stats.preprocess_s += time.perf_counter() - t0
        return pixels, grid


class VisionSequence:
    """The model callable for one vision request (see the module docstring)."""

    def __init__(self, support: VisionSupport, request: VisionPrompt, start: int,
                 state: int, lo: int | None = None):
        """`start`: tokens the cache holds, `state`: the position state there; `lo` (at most
        `start`): the earliest token it may be asked to recompute (a decoded block's start)."""
        family = support.family
        self.support = support
        self.request = request
        self.num_prompt = len(request.tokens)
        self.positions = family.positions(request, start, state, start if lo is None else lo)
        self.ends = sorted({s.end for s in request.images})
        self.on_image_end = None  # hook(end, cache), called when the cache holds an image's end
        self._features: dict[int, object] = {}  # image start -> its features, once fetched

    def __call__(self, inputs, cache):
        # (an image end at the chunk's own end is a block boundary or the prompt's end)
        return run_pieces(inputs, cache, self.ends, self._forward,
                          self._at_end if self.on_image_end is not None else None,
                          at_last=False)

    def _forward(self, ids, cache: list, a: int, b: int):
        return self.support.family.forward(ids, cache, self._spans(a, b),
                                           self.positions.ids(a, b - a))

    def _at_end(self, b: int, cache: list, logits) -> None:
        import mlx.core as mx

        mx.eval([c.state for c in cache])
        self.on_image_end(b, cache)

    def _spans(self, first: int, last: int) -> list:
        """(a, b, features) of the image tokens in [first, last), chunk-relative."""
        spans = []
        for s in self.request.images:
            a, b = max(s.start, first), min(s.end, last)
            if a >= b:
                continue
            features = self._features.get(s.start)
            if features is None:  # once per image and request: the cache counts requests
                features = self._features[s.start] = self.support.features_of(s, self.request)
            spans.append((a - first, b - first, features[a - s.start:b - s.start]))
        return spans
