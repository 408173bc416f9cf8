"""Vision requests on the engine: render images into the prompt, run the tower once per image,
and drive the language model with image features and M-RoPE positions.

`VisionSupport` (one per engine, on vision models only) renders prompts and owns the feature
cache. `VisionSequence` is what `generate_steps` calls as its model for one request: given any
range of the sequence (a prefill chunk, a decode step, a recomputed block) it embeds the tokens,
splices in the features of the images the range overlaps, and gives the positions Qwen-VL's
M-RoPE assigns them. Positions follow from the position state at the restored point
(`next_pos`, stored with every checkpoint), so a restore needs nothing about the images before
it (beyond any image inside the restored point's own block). Chunks are also cut at every image
end, in every run, so a checkpoint may sit right after an image (see vision_ckpt.py). Knows
nothing about keys or stores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import GenerationError
from .features import DEFAULT_FEATURE_BYTES, FeatureCache
from .images import ImageInput, ImageSlot, VisionPrompt, render_prompt


@dataclass(slots=True)
class VisionStats:
    requests: int = 0
    images: int = 0
    preprocess_s: float = 0.0  # decoding, resizing and patchifying images
    tail_restores: int = 0  # restores that ended right after an image (vision_ckpt)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class VisionSupport:
    """Image rendering, the vision tower and the feature cache for one vision model."""

    def __init__(self, lm, checkpointer=None, feature_bytes: int = DEFAULT_FEATURE_BYTES):
        if not getattr(lm, "is_vision", False):
            raise GenerationError(
                f"Model {lm.name!r} is text-only and cannot take images; load a vision model "
                "such as 'demo:qwen2_vl' (pip install 'forkv[vision]'), or drop the images.")
        self.lm = lm
        self.checkpointer = checkpointer
        self.features = FeatureCache(feature_bytes)
        self.stats = VisionStats()
        self.merge = int(lm.config["vision_config"]["spatial_merge_size"])

    def render(self, prompt, images=None) -> VisionPrompt:
        pixels: dict[bytes, np.ndarray] = {}

        def image_tokens(image: ImageInput):
            grid = self.features.grid(image.digest)
            if grid is None:
                pixels[image.digest], grid = self._preprocess(image)
            return grid, grid[0] * grid[1] * grid[2] // self.merge ** 2

        request = render_prompt(self.lm.tokenizer, prompt, images, self.lm.image_token_id,
                                image_tokens)
        request.pixels = pixels
        self.stats.requests += 1
        self.stats.images += len(request.images)
        return request

    def prepare(self, request: VisionPrompt, timings):
        """(model callable, cache, tokens already in it, boundary hook) for one request."""
        from . import vision_ckpt

        ck = self.checkpointer
        if ck is None or not ck.enabled:
            return VisionSequence(self, request, 0, 0), self.lm.make_cache(), 0, None
        t0 = time.perf_counter()
        cache, start, keys, next_pos = vision_ckpt.restore(ck, request, self.stats)
        timings.restore_s = time.perf_counter() - t0
        timings.reused_tokens = start
        # A restore right after an image ends mid-block; a decode boundary later recomputes
        # that whole block, so the sequence must know positions from the block's start.
        seq = VisionSequence(self, request, start, next_pos, lo=start // ck.block_size
                             * ck.block_size)
        return seq, cache, start, vision_ckpt.VisionRecorder(ck, keys, request, seq)

    def decode_rows(self, seqs: list[VisionSequence], offsets: list[int], inputs, caches):
        """One batched decode step: row i feeds `inputs[i]`, a generated token at index
        `offsets[i]` of its sequence, through merged (mlx-lm batch) caches, each row at its own
        M-RoPE position. For a continuous-batching scheduler; returns (rows, 1, vocab)."""
        import mlx.core as mx

        pos = [seq.end_pos + i - seq.num_prompt for seq, i in zip(seqs, offsets)]
        assert all(i >= seq.num_prompt for seq, i in zip(seqs, offsets)), "decode tokens only"
        pos = mx.broadcast_to(mx.array(pos, mx.int32)[None, :, None], (3, len(seqs), 1))
        return self.lm.model.language_model(inputs, cache=caches, position_ids=pos).logits

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
        model = self.lm.model
        dtype = model.vision_tower.patch_embed.proj.weight.dtype
        features = model.vision_tower(mx.array(pixels).astype(dtype), mx.array([slot.grid]))
        features = features.astype(model.language_model.model.embed_tokens.weight.dtype)
        mx.eval(features)
        self.features.stats.tower_runs += 1
        self.features.stats.tower_s += time.perf_counter() - t0
        self.features.put(digest, features)
        return features

    def _preprocess(self, image: ImageInput) -> tuple[np.ndarray, tuple[int, int, int]]:
        t0 = time.perf_counter()
        out = self.lm.processor.image_processor(images=[image.load()])
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"])[0])
        self.features.put_grid(image.digest, grid)
        self.stats.preprocess_s += time.perf_counter() - t0
        return np.asarray(out["pixel_values"]), grid


def mrope_positions(num_tokens: int, images: list[ImageSlot], start: int, next_pos: int,
                    merge: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Qwen-VL M-RoPE positions (3, n) of tokens[start:num_tokens], given the next text
    position at `start`; also each token's next position (-1 inside images) and the one after
    the last token. Text advances all three axes by one; an image's tokens take the base
    position plus their (t, h, w) index in the merged grid, and the text after it resumes at
    base + max(t, h, w) (mlx-vlm's `get_rope_index`)."""
    n = num_tokens - start
    pos = np.empty((3, n), np.int32)
    after = np.full(n, -1, np.int64)
    i, p = start, next_pos

    def text(upto: int) -> None:
        nonlocal i, p
        k = upto - i
        pos[:, i - start:upto - start] = np.arange(p, p + k)
        after[i - start:upto - start] = np.arange(p + 1, p + k + 1)
        i, p = upto, p + k

    for s in images:
        if s.end <= start:
            continue
        assert s.start >= start, "a sequence never starts inside an image span"
        text(s.start)
        t, h, w = s.grid[0], s.grid[1] // merge, s.grid[2] // merge
        pos[:, s.start - start:s.end - start] = np.indices((t, h, w)).reshape(3, -1) + p
        p += max(t, h, w)
        after[s.end - 1 - start] = p
        i = s.end
    text(num_tokens)
    return pos, after, p


def rewind_positions(images: list[ImageSlot], anchor: int, next_pos: int, lo: int,
                     merge: int) -> tuple[int, int]:
    """Walk the position state back from `anchor` (not inside an image) to the last point at or
    before `lo` that is not inside an image either: (that point, its next position)."""
    i, p = anchor, next_pos
    for s in reversed(images):
        if s.end > anchor:
            continue
        if s.end <= lo:
            break
        t, h, w = s.grid[0], s.grid[1] // merge, s.grid[2] // merge
        p -= i - s.end + max(t, h, w)
        i = s.start
        if i <= lo:
            return i, p
    return lo, p - (i - lo)


class VisionSequence:
    """The model callable for one vision request (see the module docstring)."""

    def __init__(self, support: VisionSupport, request: VisionPrompt, start: int,
                 next_pos: int, lo: int | None = None):
        """`start`: tokens the cache holds, `next_pos`: the position state there; `lo` (at
        most `start`): the earliest token it may be asked to recompute (a decoded block's
        start), whose positions are worked out backwards from `start`."""
        self.support = support
        self.request = request
        self.num_prompt = len(request.tokens)
        self.first, self.next_pos0 = rewind_positions(
            request.images, start, next_pos, start if lo is None else lo, support.merge)
        self.positions, self.after, self.end_pos = mrope_positions(
            self.num_prompt, request.images, self.first, self.next_pos0, support.merge)
        self.ends = sorted({s.end for s in request.images})
        self.on_image_end = None  # hook(end, cache), called when the cache holds an image's end
        self._features: dict[int, object] = {}  # image start -> its features, once fetched
        self._lm = support.lm.model.language_model

    def next_pos_at(self, pos: int) -> int | None:
        """Position state at boundary `pos` (None strictly inside an image span)."""
        if pos == self.first:
            return self.next_pos0
        if pos > self.num_prompt:
            return self.end_pos + pos - self.num_prompt
        nxt = int(self.after[pos - 1 - self.first])
        return None if nxt < 0 else nxt

    def __call__(self, inputs, cache):
        import mlx.core as mx

        first = cache[0].offset
        last = first + inputs.shape[1]
        cuts = [e for e in self.ends if first < e < last]
        logits, a = None, first
        for b in cuts + [last]:
            logits = self._forward(inputs[:, a - first:b - first], a, cache)
            if b in cuts and self.on_image_end is not None:
                mx.eval([c.state for c in cache])
                self.on_image_end(b, cache)
            a = b
        return logits

    def _forward(self, ids, first: int, cache):
        import mlx.core as mx

        n = ids.shape[1]
        pos = self._positions(first, n)
        out = self._lm(ids, inputs_embeds=self._embed(ids, first), cache=cache,
                       position_ids=mx.array(pos)[:, None, :])
        return out.logits

    def _positions(self, first: int, n: int) -> np.ndarray:
        assert first >= self.first, "nothing before the restored block is ever recomputed"
        idx = np.arange(first, first + n)
        prompt = idx < self.num_prompt
        out = np.empty((3, n), np.int32)
        out[:, prompt] = self.positions[:, idx[prompt] - self.first]
        out[:, ~prompt] = self.end_pos + idx[~prompt] - self.num_prompt
        return out

    def _embed(self, ids, first: int):
        import mlx.core as mx

        last = first + ids.shape[1]
        text = self._lm.model.embed_tokens(ids)
        parts, i = [], first
        for s in self.request.images:
            a, b = max(s.start, first), min(s.end, last)
            if a >= b:
                continue
            if i < a:
                parts.append(text[:, i - first:a - first])
            features = self._features.get(s.start)
            if features is None:  # once per image and request: the cache counts requests
                features = self._features[s.start] = self.support.features_of(s, self.request)
            parts.append(features[a - s.start:b - s.start][None])
            i = b
        if not parts:
            return text
        if i < last:
            parts.append(text[:, i - first:])
        return mx.concatenate(parts, axis=1)
