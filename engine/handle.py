"""The caller's side of one submitted request: events as they come, sync or async.

A producer — the engine thread, or a remote backend reading a server's stream — `push()`es
`GenerationEvent`s (and `fail()`s with at most one exception) into the handle; any
other thread reads them with `stream()` / `result()`, and asyncio code with `async for event in
handle` / `await handle.aresult()`. Events are buffered, so a consumer that arrives late misses
nothing. Cancelling asks the engine to drop the row at its next step. Knows nothing about mlx,
models or scheduling.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from .events import GenerationEvent, GenerationResult
from .request.sampling import SamplingParams


class RequestHandle:
    """One submitted request: iterate `stream()` (or `async for`) for events, or wait for
    `result()` (`await aresult()`); `cancel()` frees its row within one engine step."""

    def __init__(self, request_id: int, prompt_tokens: list[int], params: SamplingParams,
                 canceller: Callable[[RequestHandle], bool], block_keys: list[bytes] = ()):
        self.id = request_id
        self.prompt_tokens = prompt_tokens
        self.params = params
        self.block_keys = list(block_keys)  # the prompt's, as planned (its result carries them)
        self._cancel = canceller
        self._cond = threading.Condition()
        self._events: list = []  # GenerationEvent, or one exception last
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._top: list[dict[int, float]] = []
        self._final: GenerationEvent | None = None
        self._error: BaseException | None = None

    # -- state --------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._final is not None or self._error is not None

    @property
    def finish_reason(self) -> str | None:
        return self._final.finish_reason if self._final else None

    def cancel(self) -> bool:
        """Stop the request; False if it had already finished."""
        return False if self.done else self._cancel(self)

    # -- reading ------------------------------------------------------------------------------
    def stream(self) -> Iterator[GenerationEvent]:
        """Events as they are produced; the last one has `finish_reason` and `timings`.
        Leaving the loop early cancels the request."""
        i = 0
        try:
            while True:
                with self._cond:
                    while i >= len(self._events):
                        self._cond.wait()
                    item = self._events[i]
                i += 1
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not self.done:
                self.cancel()

    async def __aiter__(self) -> AsyncIterator[GenerationEvent]:
        """`async for event in handle`: the events of `stream()`, without blocking the loop.
        Leaving the loop early (or being cancelled) cancels the request."""
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        with self._cond:
            self._waiters.append((loop, ready))
        i = 0
        try:
            while True:
                with self._cond:
                    items = self._events[i:]
                    if not items:
                        ready.clear()
                if not items:
                    await ready.wait()
                    continue
                for item in items:
                    i += 1
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if item.finish_reason is not None:
                        return
        finally:
            with self._cond:
                self._waiters.remove((loop, ready))
            if not self.done:
                self.cancel()

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the request to finish; the whole completion, as `Engine.generate` gives."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.done, timeout):
                raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self._result()

    async def aresult(self) -> GenerationResult:
        async for _ in self:
            pass
        return self._result()

    def _result(self) -> GenerationResult:
        if self._error is not None:
            raise self._error
        f = self._final
        return GenerationResult("".join(self._text), list(self._ids), list(self._logprobs),
                                f.finish_reason, f.timings, list(self._top), self.block_keys)

    # -- the producer's side (the engine thread, or a remote backend's reader) ----------------
    def push(self, event: GenerationEvent) -> None:
        """Deliver one event to the reader (the last one has `finish_reason` set)."""
        with self._cond:
            self._text.append(event.text)
            self._ids += event.token_ids
            self._logprobs += event.logprobs
            self._top += event.top_logprobs
            if event.finish_reason is not None:
                self._final = event
            self._append(event)

    def fail(self, error: BaseException) -> None:
        """End the request with `error` (raised to the reader), unless it already ended."""
        with self._cond:
            if self.done:
                return
            self._error = error
            self._append(error)

    def _append(self, item) -> None:
        self._events.append(item)
        self._cond.notify_all()
        for loop, ready in self._waiters:
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # that event loop is closed; its reader is gone
                pass

    def __repr__(self) -> str:
        state = self.finish_reason or ("failed" if self._error else "running")
        return f"RequestHandle(id={self.id}, prompt_tokens={len(self.prompt_tokens)}, {state})"
