"""One request on the engine: its tokens, prefill cursor, sampler, text and timings.

A sequence prefills on its own single-row cache, one block-aligned chunk at a time (the same
chunks as `generate.prefill`, through the same chunk step `generate.run_chunk`, and the same
model callable — which also cuts at
turn ends (turns.py) or image ends — so its records and logits match a fresh prefill bit for
bit), then hands that cache to the batch. Each sampled token goes
through `accept`, the one place with the stop rules (EOS, stop strings, max_tokens), which
turns the token into a `GenerationEvent`. Knows nothing about other sequences.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import logging

from ..events import GenerationEvent, Timings
from .generate import BoundaryHook, chunk_ends, run_chunk
from .sampling import Sampler, SamplingParams
from .textstream import TextStream


@dataclass(slots=True)
class Sequence:
    id: int
    tokens: list[int]  # the prompt, then every sampled token
    prompt_len: int
    params: SamplingParams
    sampler: Sampler
    text: TextStream
    eos_ids: frozenset[int]
    timings: Timings = field(default_factory=Timings)
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0
    cache: list | None = None  # the row's own cache while it prefills
    pos: int = 0  # tokens the cache holds
    hook: BoundaryHook | None = None
    finish_reason: str | None = None
    request: object = None  # vision requests: the rendered prompt (images.VisionPrompt)
    # what its prefill runs through once admitted (the prefix cache's match: cuts at turn
    # ends, image features and M-RoPE positions, ...)
    model: object = None
    progress: object = None  # progress(computed, total, restored) after each prefill chunk
    plan: object = None  # what the prefix cache planned and matched for it (prefix_cache.Plan)
    chunk_base: int = 0  # prefill chunks end at chunk_base + k * block_size (0: canonical cuts)
    # the prompt's last logits when it was restored whole (a turn end at its end): no prefill
    last_logits: object = None
    drafter: object = None  # drafts.Drafter while the request may speculate
    namespace: str = ""  # whose recent outputs it drafts from and adds to

    @property
    def is_prefilling(self) -> bool:
        return self.pos < self.prompt_len

    def next_chunk(self, block_size: int) -> int:
        """Tokens in the next prefill chunk (chunks end on block boundaries; a run from a
        live cache records nothing, so its chunks only keep to the block size from there)."""
        base = self.chunk_base
        return chunk_ends(self.pos - base, self.prompt_len - base, block_size)[0] + base - self.pos

    def prefill_chunk(self, model, block_size: int):
        """Run the next prefill chunk; the last chunk returns the last-token logits."""
        t0 = time.perf_counter()
        end = self.pos + self.next_chunk(block_size)
        # (while prefilling, `tokens` is the prompt: nothing has been sampled yet)
        last = run_chunk(model, self.cache, self.tokens, self.pos, end)
        self.pos = end
        self.timings.prefill_s += time.perf_counter() - t0
        if self.hook is not None and end % block_size == 0:
            self.hook(end, self.tokens[:end], self.cache, False)
        self.report_progress()
        return last

    def report_progress(self) -> None:
        """Tell the progress callback how far the prefill is (after a chunk, or a restore of
        the whole prompt)."""
        if self.progress is not None:
            t = self.timings
            try:
                self.progress(self.pos - t.reused_tokens, self.prompt_len, t.reused_tokens)
            except Exception:  # noqa: BLE001 - a broken callback must not stop the batch
                logging.getLogger(__name__).exception("forkv progress callback failed")
                self.progress = None

    def accept(self, token: int, logprob: float, top: dict | None = None) -> GenerationEvent:
        """Take one sampled token; the event is final (finish_reason set) when it ends the run."""
        now = time.perf_counter()
        t = self.timings
        if t.generated_tokens == 0:
            self.t_first = now
            t.first_token_s = now - self.t_submit
        t.generated_tokens += 1
        self.tokens.append(token)
        finish = None
        if token in self.eos_ids:
            finish, delta = "stop", ""
        else:
            delta = self.text.add(token)
            if self.text.stopped:
                finish = "stop"
            elif t.generated_tokens == self.params.max_tokens:
                finish = "length"
        tops = [top] if top is not None else []
        if finish is None:
            return GenerationEvent(delta, [token], [logprob], top_logprobs=tops)
        return self.finish(finish, delta, [token], [logprob], tops)

    def finish(self, reason: str, delta: str = "", ids: list | None = None,
               logprobs: list | None = None, tops: list | None = None) -> GenerationEvent:
        """The final event: flush held-back text, close the timings, drop the cache."""
        if not self.text.stopped:
            delta += self.text.finish()
        now = time.perf_counter()
        t = self.timings
        if t.generated_tokens == 0:
            t.first_token_s = now - self.t_submit
        t.decode_s = now - self.t_first if self.t_first else 0.0
        self.finish_reason = reason
        self.cache = None
        return GenerationEvent(delta, ids or [], logprobs or [], reason, t, tops or [])


def make_sequence(seq_id: int, tokens: list[int], params: SamplingParams, lm,
                  vocab_limit: int | None, never: frozenset[int] = frozenset()) -> Sequence:
    sampler = Sampler(params, vocab_limit, len(tokens), lm.tokenizer,
                      kernels=getattr(lm, "kernels", None), never=never)
    return Sequence(seq_id, list(tokens), len(tokens), params, sampler,
                    TextStream(lm.tokenizer, params.stop), lm.eos_token_ids,
                    Timings(prompt_tokens=len(tokens)))
