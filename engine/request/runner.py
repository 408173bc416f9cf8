"""How one kind of model runs rows: render a prompt, decode a batch of rows.

The engine picks one runner per model: `TextRunner` for language models, `VisionRunner` (over
`vision.VisionSupport`) for vision-language models, where every request, with images or not,
carries its own model callable (image features, position state; the prefix cache's `match`
makes it). The engine renders through `render` and the scheduler decodes through `decode`, so
nothing else in the request path asks "is this vision?". Runs on the engine thread, except
`render`, which is pure tokenizer work for text.
"""

from __future__ import annotations

from ..errors import GenerationError
from ..vision.images import has_image_parts


class TextRunner:
    # a row's decode input is its last token alone, so a step can be built on a token not yet
    # read back (ahead.py); a vision row's position state follows its token count
    runs_ahead = True

    def __init__(self, engine):
        self.engine = engine

    def render(self, prompt, images):
        """(prompt tokens, None): text models take no images."""
        if images or has_image_parts(prompt):
            raise GenerationError(
                f"Model {self.engine.lm.name!r} is text-only and cannot take images; load a "
                "vision model such as 'demo:qwen2_vl' (pip install 'forkv[vision]'), or drop "
                "the images.")
        return self.engine.encode(prompt), None

    def model_of(self, tokens: list[int]):
        """The model callable `(inputs, cache=)` of a text-only prompt of `tokens`."""
        return self.engine.lm.model

    def decode(self, rows, inputs, caches):
        return self.engine.lm.model(inputs, cache=caches)

    def verify(self, seq, tokens: list[int], caches, offset: int):
        """The logits of a verify chunk (one row: `tokens` from index `offset` of the
        sequence on: its last token and a draft), each position with one-token decode's bits
        (speculate.py). Also feeds the kept tokens again after a rollback that could not trim."""
        import mlx.core as mx

        from .speculate import rowwise

        with rowwise():
            return self.engine.lm.model(mx.array([tokens]), cache=caches)


class VisionRunner:
    runs_ahead = False

    def __init__(self, engine):
        self.engine = engine
        self.vision = engine.vision

    def render(self, prompt, images):
        # The feature cache belongs to the engine thread: render there.
        request = self.engine.run_on_thread(self.vision.render, prompt, images)
        return request.tokens, request

    def model_of(self, tokens: list[int]):
        """TextRunner.model_of: the language model at the positions of a text-only prompt."""
        from ..vision.images import VisionPrompt

        return self.vision.sequence(VisionPrompt(list(tokens), []))

    def decode(self, rows, inputs, caches):
        # Each row at its own position state (e.g. M-RoPE), through the merged caches.
        return self.vision.decode_rows([s.model for s in rows],
                                       [len(s.tokens) - 1 for s in rows], inputs, caches)

    def verify(self, seq, tokens: list[int], caches, offset: int):
        """TextRunner.verify for a vision row, at its own position state."""
        import mlx.core as mx

        from .speculate import rowwise

        with rowwise():
            return self.vision.decode_rows([seq.model], [offset], mx.array([tokens]), caches)


def make_runner(engine):
    return VisionRunner(engine) if getattr(engine.lm, "is_vision", False) else TextRunner(engine)
