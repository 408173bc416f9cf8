"""Many requests on one model at once: submit, stream, cancel (continuous batching).

`BatchEngine(engine)` wraps a single-request `Engine` (its model, block size and checkpoints):
`submit(prompt, params)` returns a `RequestHandle` at once; requests join the running batch as
slots free up, are restored from checkpoints and prefilled between decode steps, decode
together and leave when done (see `scheduler.py` for the policy). Streaming gives the same
`GenerationEvent`s as `Engine.stream`, and greedy output matches it token for token.

Drive it either way: call `step()` (or just iterate a handle's `stream()` / call `result()`,
which step the engine as needed), or `start()` a background thread that steps whenever there is
work. Models whose caches cannot be merged into a batch run one request at a time: a
`ForkvWarning` says so and `is_batched` is False. `generate_batch()` is the one-call form.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Self

from .batchcache import merge_blocker
from .engine import Engine
from .errors import ForkvWarning, GenerationError
from .events import GenerationEvent, GenerationResult
from .sampling import SamplingParams
from .scheduler import Scheduler, StepReport
from .sequence import make_sequence

DEFAULT_MAX_SEQS = 8
_log = logging.getLogger(__name__)


class RequestHandle:
    """One submitted request: iterate `stream()` for events, or wait for `result()`."""

    def __init__(self, owner: BatchEngine, request_id: int, prompt_tokens: list[int],
                 params: SamplingParams):
        self.id = request_id
        self.prompt_tokens = prompt_tokens
        self.params = params
        self._owner = owner
        self._events: queue.SimpleQueue[GenerationEvent] = queue.SimpleQueue()
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._final: GenerationEvent | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def finish_reason(self) -> str | None:
        return self._final.finish_reason if self._final else None

    def stream(self) -> Iterator[GenerationEvent]:
        """Events as they are produced; the last one has `finish_reason` and `timings`."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                if self._owner._drive(self):
                    continue
                event = self._events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event.finish_reason is not None:
                return

    def result(self) -> GenerationResult:
        """Wait for the request to finish; the whole completion, as `Engine.generate` gives."""
        while not self._done.is_set():
            if not self._owner._drive(self):
                self._done.wait()
        if self._error is not None:
            raise self._error
        final = self._final
        return GenerationResult("".join(self._text), list(self._ids), list(self._logprobs),
                                final.finish_reason, final.timings)

    def cancel(self) -> bool:
        return self._owner.cancel(self)

    def _push(self, event: GenerationEvent) -> None:
        self._text.append(event.text)
        self._ids += event.token_ids
        self._logprobs += event.logprobs
        if event.finish_reason is not None:
            self._final = event
            self._done.set()
        self._events.put(event)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()
        self._events.put(error)

    def __repr__(self) -> str:
        state = self.finish_reason or "running"
        return f"RequestHandle(id={self.id}, prompt_tokens={len(self.prompt_tokens)}, {state})"


class BatchEngine:
    """Continuous batching over one `Engine`.

    `max_seqs` caps the sequences that prefill or decode at once (others wait, FIFO);
    `max_prefill_tokens` caps the prompt tokens one step prefills (default: one block), so
    running rows get a decode step at least that often.
    """

    def __init__(self, engine: Engine | str, max_seqs: int = DEFAULT_MAX_SEQS,
                 max_prefill_tokens: int | None = None):
        self._owns_engine = isinstance(engine, str)
        self.engine = Engine(engine) if self._owns_engine else engine
        if max_seqs < 1:
            raise GenerationError(f"max_seqs must be at least 1, got {max_seqs}.")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise GenerationError(
                f"max_prefill_tokens must be at least 1, got {max_prefill_tokens}.")
        blocker = merge_blocker(self.engine.lm.make_cache())
        self.is_batched = blocker is None
        if blocker is not None:
            warnings.warn(
                f"forkv cannot batch {self.engine.lm.name}: its {blocker} caches cannot be "
                "merged, so requests will run one at a time.", ForkvWarning, stacklevel=2)
        self.scheduler = Scheduler(self.engine, max_seqs,
                                   max_prefill_tokens or self.engine.block_size,
                                   mergeable=self.is_batched)
        self._handles: dict[int, RequestHandle] = {}
        self._seqs: dict[int, object] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False

    # -- requests -----------------------------------------------------------------------------
    def submit(self, prompt, params: SamplingParams | None = None, images=None,
               **kwargs) -> RequestHandle:
        """Queue a completion of `prompt` (text, token ids or chat messages); `images` as for
        `Engine.stream` (vision models)."""
        params = params or SamplingParams(**kwargs)
        engine = self.engine
        tokens, request = engine.render_request(prompt, images, params)
        with self._lock:
            if self._closing:
                raise GenerationError("This BatchEngine is closed; create a new one.")
            rid = next(self._ids)
            handle = RequestHandle(self, rid, tokens, params)
            seq = make_sequence(rid, tokens, params, engine.lm, engine._vocab_limit)
            seq.request = request
            self._handles[rid], self._seqs[rid] = handle, seq
            self.scheduler.add(seq)
            self._wake.notify_all()
        return handle

    def cancel(self, handle: RequestHandle) -> bool:
        """Stop a request now and free its row; False if it had already finished."""
        with self._lock:
            seq = self._seqs.get(handle.id)
            event = self.scheduler.cancel(seq) if seq is not None else None
            if event is None:
                return False
            self._deliver(seq, event)
            return True

    # -- running ------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_prefilling(self) -> int:
        return len(self.scheduler.prefilling)

    @property
    def num_running(self) -> int:
        """Rows decoding in the batch."""
        return len(self.scheduler.rows)

    def step(self) -> StepReport:
        """Admit, prefill up to the budget, decode every row once; deliver the events."""
        with self._lock:
            try:
                report = self.scheduler.step()
            except Exception as e:
                # The batch may be half-updated: fail every request rather than guess.
                for rid in list(self._handles):
                    self._handles.pop(rid)._fail(e)
                self._seqs.clear()
                self.scheduler.clear()
                raise
            for seq, event in report.events:
                self._deliver(seq, event)
            return report

    def run(self) -> None:
        """Step until every submitted request has finished."""
        while self.has_work:
            self.step()

    def start(self) -> BatchEngine:
        """Step on a background thread whenever there is work (until `close()`)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="forkv-batch",
                                                daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Cancel what is still queued or running, stop the background thread (and close the
        engine if this object loaded it)."""
        with self._lock:
            self._closing = True
            for rid, seq in list(self._seqs.items()):
                event = self.scheduler.cancel(seq)
                if event is not None:
                    self._deliver(seq, event)
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.has_work and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                try:
                    self.step()
                except Exception:  # noqa: BLE001 - the thread must outlive a failed step
                    # Every waiting request already has the error; keep serving new ones.
                    _log.exception("forkv batch step failed")

    def _drive(self, handle: RequestHandle) -> bool:
        """Step for a caller waiting on `handle`; False when a background thread steps."""
        if self._thread is not None:
            return False
        with self._lock:
            if not handle.done:
                if not self.has_work:
                    raise GenerationError(f"Request {handle.id} is not queued in this engine.")
                self.step()
        return True

    def _deliver(self, seq, event: GenerationEvent) -> None:
        handle = self._handles[seq.id]
        handle._push(event)
        if event.finish_reason is not None:
            del self._handles[seq.id], self._seqs[seq.id]


def generate_batch(engine: Engine | BatchEngine, prompts: Sequence,
                   params: SamplingParams | Sequence[SamplingParams] | None = None,
                   **kwargs) -> list[GenerationResult]:
    """Complete every prompt together; results in prompt order. `params` is one
    SamplingParams for all, or one per prompt; keyword arguments go to `BatchEngine`."""
    if isinstance(params, SamplingParams) or params is None:
        params = [params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts):
        raise GenerationError(
            f"Got {len(params)} SamplingParams for {len(prompts)} prompts; pass one per prompt.")
    batch = engine if isinstance(engine, BatchEngine) else BatchEngine(
        engine, **{"max_seqs": max(1, len(prompts)), **kwargs})
    handles = [batch.submit(p, sp) for p, sp in zip(prompts, params)]
    return [h.result() for h in handles]
