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
from .live import rings, widen


class TextRunner:
    # Blocks decoded past a boundary are recorded later by a prefill-only job of the tokens.
    defers_decode_records = True
    keeps_live = True  # fast reuse continues finished rows' caches (live.py)

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
        or a turn end after it — its whole prompt, with the last logits, when it ends at
        one), its position, its boundary recorder and the model callable that cuts and
        records its turn ends."""
        ck = self.engine.checkpointer
        if ck is None:
            seq.cache, seq.pos, seq.hook = self.engine.lm.make_cache(), 0, None
            return
        t0 = time.perf_counter()
        live = self.engine.live if seq.reuse == "fast" and not seq.is_record_job else None
        entry, u = live.best(seq.tokens, seq.keyer.tag) if live is not None else (None, 0)
        if entry is not None and u // ck.block_size < seq.prompt_len // ck.block_size - 1:
            # What is left would cross more than one block boundary, which a run from a live
            # cache cannot record (its chunks start off the canonical cuts; its record job
            # does, once its cache leaves the pool): run it from the records, which records
            # every block it computes, rather than leave later requests without them.
            entry, u = None, 0
        bound = ck.restore_bound(seq.tokens, seq.keyer) if entry is not None else 0
        if entry is not None and u >= bound:
            # No record could restore more: do not read them.
            ck.count_restore(len(seq.tokens), 0)
            restored, n, past = None, 0, bound
        else:
            restored = ck.restore_run(seq.tokens, count=not seq.is_record_job, keyer=seq.keyer)
            n = past = restored.position
        if entry is not None and u > n:
            # Continue the live cache: nothing this run computes is recorded from it (its
            # chunks start off the canonical cuts); a record job does that when it leaves.
            ck.count_restore(0, u - n)
            seq.cache, seq.pos, seq.hook = live.take(entry, u), u, None
            seq.model, seq.live_from, seq.recorded_to = self.engine.lm.model, u, n
            live.stats.beyond_records += u - past  # (past the most records could give)
        else:
            seq.cache, seq.pos, seq.hook = restored.cache, n, ck.recorder(
                restored.keys, keyer=restored.keyer)
            seq.model = ck.model_for(seq.tokens, restored.keys, restored.keyer)
            seq.last_logits = restored.logits  # (the whole prompt restored: no prefill)
        seq.timings.restore_s = time.perf_counter() - t0
        seq.timings.reused_tokens = seq.pos

    def keep_live(self, seq, cache: list, n_tokens: int) -> None:
        """Offer a fast request's cache (holding its first `n_tokens` tokens; the pool owns
        it now) to later fast requests of its namespace. A request that continued a live
        cache leaves with its record job: when this entry leaves the pool, its tokens are
        prefilled canonically and recorded (a second job of the same tokens finds them
        recorded and does nothing)."""
        engine = self.engine
        live, ck = engine.live, engine.checkpointer
        rings_before, seq.rings_before = seq.rings_before, None
        if live is None or seq.reuse != "fast" or seq.is_record_job or n_tokens < 1:
            return
        tokens = seq.tokens[:n_tokens]
        if rings_before is not None and n_tokens > rings_before[0]:
            start, before = rings_before
            cache = widen(cache, before, n_tokens - start, engine.lm.make_cache)
        if n_tokens == seq.prompt_len and live.enabled:
            # the prompt's rings, for the answer's cache (decoding trims them to W)
            seq.rings_before = (n_tokens, rings(cache))
        on_leave = None
        if seq.live_from:
            B = engine.block_size
            upto = max(seq.prompt_len, n_tokens // B * B)
            job_tokens, first, keyer = seq.tokens[:upto], seq.recorded_to // B, seq.keyer
            on_leave = lambda: engine.scheduler.jobs.append(  # noqa: E731
                engine._record_job(job_tokens, first, keyer))
        live.put(tokens, cache, seq.keyer.tag, ck.checkpoint_keys(tokens, seq.keyer), on_leave)

    def decode(self, rows, inputs, caches):
        return self.engine.lm.model(inputs, cache=caches)

    def recorded(self, seq) -> bool:
        """Whether every record of `seq`'s last block exists (a record job with nothing to do:
        a request that needed those blocks prefilled them itself)."""
        ck = self.engine.checkpointer
        if not (seq.keys and all(ck.store.contains(seq.keys[-1], k) for k in ck.kinds)):
            return False
        # and the turn ends after that block (a fast request's job records those too)
        ends = ck.turns.keys(seq.tokens, seq.keys, seq.keyer) if ck.turns else {}
        B = self.engine.block_size
        return all(ck.store.contains(key, "extra") for end, key in ends.items()
                   if end > len(seq.keys) * B)


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
