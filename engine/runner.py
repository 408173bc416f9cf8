"""How one kind of model runs rows: render a prompt, prepare a row, decode a batch of rows.

The engine picks one runner per model: `TextRunner` for language models, `VisionRunner` (over
`vision.VisionSupport`) for vision-language models, where every request, with images or not,
carries its own model callable (image features, position state). The scheduler calls only
these three methods, so nothing else in the request path asks "is this vision?". Runs on the
engine thread, except `render`, which is pure tokenizer work for text.
"""

from __future__ import annotations

import time

from .errors import GenerationError
from .images import has_image_parts


class TextRunner:
    # Blocks decoded past a boundary are recorded later by a prefill-only job of the tokens.
    defers_decode_records = True

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

    def prepare(self, seq) -> None:
        """Give `seq` a cache restored from the longest checkpointed prefix (a block boundary,
        or a turn end after it), its position, its boundary recorder and the model callable
        that cuts and records its turn ends."""
        ck = self.engine.checkpointer
        if ck is None:
            seq.cache, seq.pos, seq.hook = self.engine.lm.make_cache(), 0, None
            return
        t0 = time.perf_counter()
        restored = ck.restore_run(seq.tokens, count=not seq.is_record_job, keyer=seq.keyer)
        seq.timings.restore_s = time.perf_counter() - t0
        seq.timings.reused_tokens = restored.position
        seq.cache, seq.pos, seq.hook = restored.cache, restored.position, ck.recorder(
            restored.keys, keyer=restored.keyer)
        seq.model = ck.model_for(seq.tokens, restored.keys, restored.keyer)

    def decode(self, rows, inputs, caches):
        return self.engine.lm.model(inputs, cache=caches)

    def recorded(self, seq) -> bool:
        """Whether every record of `seq`'s last block exists (a record job with nothing to do:
        a request that needed those blocks prefilled them itself)."""
        ck = self.engine.checkpointer
        return bool(seq.keys) and all(ck.store.contains(seq.keys[-1], k) for k in ck.kinds)


class VisionRunner:
    # A record job would need the request's images: decoded blocks are recomputed in the step.
    defers_decode_records = False

    def __init__(self, engine):
        self.engine = engine
        self.vision = engine.vision

    def render(self, prompt, images):
        # The feature cache belongs to the engine thread: render there.
        request = self.engine.run_on_thread(self.vision.render, prompt, images)
        return request.tokens, request

    def prepare(self, seq) -> None:
        seq.model, seq.cache, seq.pos, seq.hook = self.vision.prepare(seq.request, seq.timings,
                                                                      seq.keyer)

    def decode(self, rows, inputs, caches):
        # Each row at its own position state (e.g. M-RoPE), through the merged caches.
        return self.vision.decode_rows([s.model for s in rows],
                                       [len(s.tokens) - 1 for s in rows], inputs, caches)


def make_runner(engine):
    return VisionRunner(engine) if getattr(engine.lm, "is_vision", False) else TextRunner(engine)
