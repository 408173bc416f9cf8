"""Qwen vision-language models (mlx-vlm's `qwen2_vl` and `qwen3_5`): M-RoPE positions.

Qwen-VL gives every token three position ids (time, height, width). Text advances all three by
one; an image's tokens take the image's base position plus their (t, h, w) index in the merged
patch grid, and the text after the image resumes at base + max(t, h, w) (mlx-vlm's
`get_rope_index`). So positions run ahead of the token count after an image, and the engine
carries one number per boundary: the walk's position state there — the next text position, or
inside an image the image's base. `MRopePositions` computes positions from any boundary given
that state, and walks it back to an earlier boundary (a decoded block's start). Both families
splice the tower's features into the text embeddings and pass explicit `position_ids`.
Knows nothing about keys or checkpoints.
"""

from __future__ import annotations

import numpy as np

from .family import Positions, VisionFamily, splice


def _dims(slot, merge: int) -> tuple[int, int, int]:
    t, h, w = slot.grid
    return t, h // merge, w // merge


def mrope_positions(num_tokens: int, images: list, start: int, state: int,
                    merge: int) -> tuple[np.ndarray, np.ndarray, int]:
    """M-RoPE positions (3, n) of tokens[start:num_tokens] given the state at `start`; also the
    state after each token, and the state after the last one."""
    n = num_tokens - start
    pos = np.empty((3, n), np.int32)
    after = np.empty(n, np.int64)
    i, p = start, state

    def text(upto: int) -> None:
        nonlocal i, p
        k = upto - i
        pos[:, i - start:upto - start] = np.arange(p, p + k)
        after[i - start:upto - start] = np.arange(p + 1, p + k + 1)
        i, p = upto, p + k

    for s in images:
        if s.end <= start:
            continue
        if s.start >= i:
            text(s.start)
        t, h, w = _dims(s, merge)
        # `i` may lie inside this image (a restore there): `p` is then the image's base.
        pos[:, i - start:s.end - start] = np.indices((t, h, w)).reshape(3, -1)[:, i - s.start:] + p
        after[i - start:s.end - start - 1] = p
        p += max(t, h, w)
        after[s.end - 1 - start] = p
        i = s.end
    text(num_tokens)
    return pos, after, p


def rewind_state(images: list, anchor: int, state: int, lo: int, merge: int) -> int:
    """The position state at `lo` <= `anchor`, given the state at `anchor`."""
    i, p = anchor, state
    for s in reversed(images):
        if s.start >= i:
            continue
        if s.end > i:  # `i` inside this image: p is its base, as at its start
            if lo > s.start:
                return p
            i = s.start
            continue
        if lo >= s.end:
            break
        base = p - (i - s.end) - max(_dims(s, merge))
        if lo > s.start:
            return base
        i, p = s.start, base
    return p - (i - lo)


class MRopePositions(Positions):
    def __init__(self, request, lo: int, state: int, merge: int):
        super().__init__(len(request.tokens))
        self.lo = lo
        self.pos, self.after, self.end_state = mrope_positions(
            self.num_prompt, request.images, lo, state, merge)
        self.state_lo = state

    def state_at(self, pos: int) -> int:
        if pos == self.lo:
            return self.state_lo
        if pos > self.num_prompt:
            return self.end_state + pos - self.num_prompt
        return int(self.after[pos - 1 - self.lo])

    def ids(self, first: int, n: int) -> np.ndarray:
        assert first >= self.lo, "nothing before the restored block is ever recomputed"
        idx = np.arange(first, first + n)
        prompt = idx < self.num_prompt
        out = np.empty((3, n), np.int32)
        out[:, prompt] = self.pos[:, idx[prompt] - self.lo]
        out[:, ~prompt] = self.end_state + idx[~prompt] - self.num_prompt
        return out


class QwenFamily(VisionFamily):
    model_types = ("qwen2_vl", "qwen3_5")

    def __init__(self, lm):
        super().__init__(lm)
        self.merge = int(lm.config["vision_config"]["spatial_merge_size"])
        self.image_processor = lm.processor.image_processor

    def num_tokens(self, grid) -> int:
        return grid[0] * grid[1] * grid[2] // self.merge ** 2

    def preprocess(self, image):
        out = self.image_processor(images=[image])
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"])[0])
        return np.asarray(out["pixel_values"]), grid

    def encode(self, pixels, grid):
        import mlx.core as mx

        tower = self.model.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype
        features = tower(mx.array(pixels).astype(dtype), mx.array([grid]))
        if isinstance(features, tuple):  # qwen3_5: (features, deepstack features (none))
            features = features[0]
        return features.astype(self.embed_dtype)

    def positions(self, request, start, state, lo):
        state = rewind_state(request.images, start, state, lo, self.merge)
        return MRopePositions(request, lo, state, self.merge)

    def forward(self, ids, cache, spans, positions):
        import mlx.core as mx

        embeds = splice(self.language_model.model.embed_tokens(ids), spans)
        return self.language_model(ids, inputs_embeds=embeds, cache=cache,
                                   position_ids=mx.array(positions)[:, None, :]).logits

    def decode(self, seqs, offsets, inputs, caches):
        import mlx.core as mx

        assert all(i >= s.positions.num_prompt for s, i in zip(seqs, offsets)), "decode only"
        pos = [s.positions.end_state + i - s.positions.num_prompt for s, i in zip(seqs, offsets)]
        n = inputs.shape[1]  # 1, or a verify chunk's tokens (speculate.py)
        pos = mx.array(pos, mx.int32)[:, None] + mx.arange(n, dtype=mx.int32)[None]
        pos = mx.broadcast_to(pos[None], (3, len(seqs), n))
        return self.language_model(inputs, cache=caches, position_ids=pos).logits
