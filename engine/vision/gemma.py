"""Gemma vision-language models (mlx-vlm's `gemma3` and `gemma4`): plain positions.

Gemma's language models place every token, image tokens included, at its index (the cache
offset), so the only position state is the token count. Image tokens are embedded the way
mlx-vlm's own `get_input_embeddings` does it (its code runs, fed the cached features): Gemma 3
scales the projected features by 1/sqrt(hidden) and zeroes pad tokens before the language
model scales everything back; Gemma 4 also derives its per-layer inputs with image tokens
blanked. Attention over image tokens is causal, as in mlx-vlm's language models (Gemma 3 builds
a 4-D mask there that its language model never reads); a Gemma 4 config asking for
bidirectional attention inside images is refused at load, since an image could then not be
split at a block boundary. Knows nothing about keys or checkpoints.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelLoadError
from .family import VisionFamily


class _Gemma(VisionFamily):
    def num_tokens(self, grid) -> int:
        return grid[0] * grid[1] * grid[2]

    def forward(self, ids, cache, spans, positions):
        import mlx.core as mx

        if not spans:
            return self.language_model(ids, cache=cache).logits
        features = mx.concatenate([f for _, _, f in spans]).astype(self.embed_dtype)
        return self._forward_images(ids, cache, features)

    def _forward_images(self, ids, cache, features):
        raise NotImplementedError


class Gemma3Family(_Gemma):
    model_types = ("gemma3",)

    def __init__(self, lm):
        super().__init__(lm)
        self.placeholder_id = int(lm.config["boi_token_index"])
        self.eoi_id = int(lm.config["eoi_token_index"])
        self.side = int(round(lm.config["text_config"].get("mm_tokens_per_image", 256) ** 0.5))
        self.image_processor = lm.processor.image_processor

    def wrap(self, tokenizer):
        # What Gemma3Processor puts around the image tokens (full_image_sequence).
        nl = tokenizer.encode("\n\n", add_special_tokens=False)
        return [*nl, self.placeholder_id], [self.eoi_id, *nl]

    def preprocess(self, image):
        out = self.image_processor(images=[image])
        return np.asarray(out["pixel_values"]), (1, self.side, self.side)

    def encode(self, pixels, grid):
        import mlx.core as mx

        tower = self.model.vision_tower
        dtype = tower.vision_model.embeddings.patch_embedding.weight.dtype
        hidden, _, _ = tower(mx.array(pixels).transpose(0, 2, 3, 1).astype(dtype),
                             output_hidden_states=True)
        return self.model.multi_modal_projector(hidden)[0].astype(self.embed_dtype)

    def _forward_images(self, ids, cache, features):
        import mlx.core as mx

        out = self.model.get_input_embeddings(
            ids, pixel_values=mx.zeros((1,)), mask=mx.ones(ids.shape, mx.int32),
            cached_image_features=features[None])
        return self.language_model(ids, inputs_embeds=out.inputs_embeds, cache=cache).logits


class Gemma4Family(_Gemma):
    model_types = ("gemma4",)

    def __init__(self, lm):
        super().__init__(lm)
        text = lm.config.get("text_config", {})
        if text.get("use_bidirectional_attention") == "vision":
            raise ModelLoadError(
                f"forkv cannot yet checkpoint {lm.name!r}: its config asks for bidirectional "
                "attention inside images (text_config.use_bidirectional_attention); use a "
                "Gemma 4 model without it.")
        self.image_processor = lm.processor.image_processor
        self.pooling = int(self.image_processor.pooling_kernel_size)
        self.patch = int(self.image_processor.patch_size)
        boi, eoi = lm.config.get("boi_token_id"), lm.config.get("eoi_token_id")
        self._wrap = ([int(boi)] if boi is not None else [], [int(eoi)] if eoi is not None else [])

    def wrap(self, tokenizer):
        return self._wrap  # Gemma4Processor: boi + image tokens + eoi

    def preprocess(self, image):
        out, _ = self.image_processor(images=[image])
        pixels = np.asarray(out["pixel_values"])
        h, w = pixels.shape[-2:]
        k = self.patch * self.pooling
        return pixels, (1, h // k, w // k)

    def encode(self, pixels, grid):
        import mlx.core as mx

        # Pixels stay float32, as mlx-vlm's generation passes them.
        return self.model.encode_image(mx.array(pixels))[0].astype(self.embed_dtype)

    def _forward_images(self, ids, cache, features):
        import mlx.core as mx

        out = self.model.get_input_embeddings(ids, pixel_values=mx.zeros((1,)),
                                              cached_image_features=features)
        return self.language_model(None, inputs_embeds=out.inputs_embeds, cache=cache,
                                   per_layer_inputs=out.per_layer_inputs).logits
