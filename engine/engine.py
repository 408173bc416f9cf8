"""The engine facade: prompt in, streamed events out, for one loaded model.

`Engine.stream()` renders a prompt (text, token ids or chat messages) to tokens, runs the token
generator and turns its steps into `GenerationEvent`s; `generate()` collects them. The
checkpoint machinery plugs in through `prepare()`/the boundary hook. Requests on vision models
(images) go through `vision` (vision.py), which supplies their own model callable and hook.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from .checkpoint import Checkpointer
from .errors import GenerationError
from .events import GenerationEvent, GenerationResult, Timings
from .generate import generate_steps
from .images import has_image_parts
from .loader import LoadedModel, load_model
from .recordstore import RecordStore
from .sampling import Sampler, SamplingParams
from .textstream import TextStream

DEFAULT_BLOCK_SIZE = 256


class Engine:
    """Generation with block checkpoints for one model.

    `store` holds the records: by default a RAM tier over the encrypted disk tier, configured
    by `settings` (a `forkv.security.StoreSettings`, else from `FORKV_*` variables); pass
    `checkpoints=False` to run without any. `namespace` salts block keys per tenant.
    """

    def __init__(self, model: LoadedModel | str, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 store: RecordStore | None = None, settings=None, namespace: str = "",
                 checkpoints: bool = True):
        self.lm = load_model(model) if isinstance(model, str) else model
        if block_size <= 0:
            raise GenerationError(f"block_size must be positive, got {block_size}.")
        self.block_size = block_size
        if store is None and checkpoints:
            store = make_record_store(settings, block_size)
        self.store = store
        self.checkpointer = Checkpointer(self.lm, store, block_size, namespace) if store else None
        self._vocab_limit = len(self.lm.tokenizer.vocab) if hasattr(
            self.lm.tokenizer, "vocab") else None
        self._vision = None

    # -- prompts -----------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int] | Sequence[dict],
               add_generation_prompt: bool = True) -> list[int]:
        """Token ids for plain text, token ids, or chat messages (via the chat template)."""
        tok = self.lm.tokenizer
        if isinstance(prompt, str):
            ids = tok.encode(prompt, add_special_tokens=False)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            ids = tok.apply_chat_template(list(prompt), tokenize=True,
                                          add_generation_prompt=add_generation_prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise GenerationError("The prompt is empty; give at least one token of text.")
        return list(ids)

    # -- generation --------------------------------------------------------------------------
    def stream(self, prompt, params: SamplingParams | None = None, images=None,
               **kwargs) -> Iterator[GenerationEvent]:
        """Stream a completion of `prompt`; keyword arguments build a SamplingParams.

        `images` (bytes, local paths or PIL images) fill the prompt's `{"type": "image"}`
        parts in order; parts may also carry their image in an "image" field. Vision models
        only (see `vision`)."""
        params = params or SamplingParams(**kwargs)
        tokens, request = self.render_request(prompt, images, params)
        yield from self._run(tokens, params, request)

    def render_request(self, prompt, images, params: SamplingParams):
        """Prompt tokens (and the vision request, for images) of a checked request."""
        request = None
        if images or self.lm.is_vision or has_image_parts(prompt):
            request = self.vision.render(prompt, images)
            tokens = request.tokens
        else:
            tokens = self.encode(prompt)
        if len(tokens) + params.max_tokens > self.lm.context_length:
            raise GenerationError(
                f"Prompt ({len(tokens)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"the model's context of {self.lm.context_length}; shorten one of them.")
        return tokens, request

    def generate(self, prompt, params: SamplingParams | None = None, **kwargs) -> GenerationResult:
        text, ids, logprobs, last = [], [], [], None
        for event in self.stream(prompt, params, **kwargs):
            text.append(event.text)
            ids += event.token_ids
            logprobs += event.logprobs
            last = event
        assert last is not None and last.finish_reason is not None
        return GenerationResult("".join(text), ids, logprobs, last.finish_reason, last.timings)

    def _run(self, tokens: list[int], params: SamplingParams,
             request=None) -> Iterator[GenerationEvent]:
        t0 = time.perf_counter()
        timings = Timings(prompt_tokens=len(tokens))
        if request is None:
            model, (cache, start, hook) = self.lm.model, self.prepare(tokens, timings)
        else:  # a vision request: its own model callable (image features, M-RoPE positions)
            model, cache, start, hook = self.vision.prepare(request, timings)
        timings.computed_tokens = len(tokens) - start
        stream = TextStream(self.lm.tokenizer, params.stop)
        raw: dict = {}
        steps = generate_steps(model, cache, tokens, start,
                               Sampler(params, self._vocab_limit), params.max_tokens,
                               self.block_size, self.lm.eos_token_ids, hook, raw)
        finish, ids, lps, delta = "length", [], [], ""
        for step in steps:
            timings.generated_tokens += 1
            ids, lps = [step.token], [step.logprob]
            finish = None
            if step.token in self.lm.eos_token_ids:
                finish, delta = "stop", ""
            else:
                delta = stream.add(step.token)
                if stream.stopped:
                    finish = "stop"
                elif timings.generated_tokens == params.max_tokens:
                    finish = "length"
            if finish:
                steps.close()
                break
            yield GenerationEvent(delta, ids, lps)
        if not stream.stopped:
            delta += stream.finish()
        timings.prefill_s = raw.get("prefill_s", 0.0)
        timings.first_token_s = raw.get("first_token_s", time.perf_counter() - t0)
        timings.decode_s = raw.get("decode_s", time.perf_counter() - t0 - timings.prefill_s)
        yield GenerationEvent(delta, ids, lps, finish or "length", timings)

    def prepare(self, tokens: list[int], timings: Timings):
        """A cache to start from, how many tokens it already holds, and the boundary hook."""
        if self.checkpointer is None:
            return self.lm.make_cache(), 0, None
        t0 = time.perf_counter()
        restored = self.checkpointer.restore(tokens)
        timings.restore_s = time.perf_counter() - t0
        timings.reused_tokens = restored.position
        return restored.cache, restored.position, self.checkpointer.recorder(restored.keys)

    def stats(self) -> dict:
        """Checkpoint statistics: reuse, hits/misses per record kind, bytes per tier, evictions."""
        if self.checkpointer is None:
            return {"checkpoints": False}
        out = {"checkpoints": self.checkpointer.enabled, **self.checkpointer.stats.as_dict()}
        tiers = self.store.stats
        out["ram"] = {"bytes": tiers.ram_bytes, "records": tiers.ram_records,
                      "evictions": tiers.ram_evictions, "spilled": tiers.spilled,
                      "bytes_by_kind": dict(tiers.by_kind)}
        if self.store.disk is not None:
            d = self.store.disk.stats()
            out["disk"] = {"bytes": d.bytes_on_disk, "records": d.num_records,
                           "evictions": d.num_evictions, "bytes_written": d.bytes_written,
                           "dropped": d.num_dropped, "tampered": d.num_tampered,
                           "degraded": d.is_degraded, "hits": d.num_hits, "misses": d.num_misses}
        return out

    @property
    def vision(self):
        """Image support of a vision model: rendering, the vision tower, the feature cache
        (`vision.features`). A `GenerationError` on text-only models."""
        if self._vision is None:
            from .vision import VisionSupport

            self._vision = VisionSupport(self.lm, self.checkpointer)
        return self._vision

    def close(self) -> None:
        """Stop the disk tier's writer: a persistent store keeps its records (RAM tier
        included), an ephemeral one removes its files."""
        if self.store is not None:
            self.store.close()


def make_record_store(settings=None, block_size: int = DEFAULT_BLOCK_SIZE) -> RecordStore:
    """The default tiers: RAM budget over the encrypted blob store (unless turned off)."""
    from forkv.security import BlobStore, StoreSettings

    settings = settings or StoreSettings.from_env()
    disk = BlobStore(settings) if settings.disk else None
    return RecordStore(settings.ram_budget, disk, block_size)
