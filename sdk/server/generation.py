"""Running requests for the HTTP routes: submit off the event loop, iterate, cancel, collect.

`start()` tokenizes and submits (n > 1: n requests of one prompt, which the engine runs as
forks: the later ones wait for the first one's prefill and restore it), mapping refusals to
HTTP errors: a full queue is 429, a prompt past the context 400 `context_length_exceeded`.
`events()` iterates one handle, records time to first token and generated tokens, and cancels
the request if the consumer stops early (a client that went away). Knows no response format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from forkv.engine import GenerationError, GenerationEvent, SamplingParams, Timings
from forkv.engine.errors import ContextTooLong, check_context

from . import logs
from .served_engine import QueueFull
from .errors import APIError

__all__ = ["Collected", "collect", "events", "interleaved", "prediction_details", "start",
           "stream_error", "watch_disconnect"]


def prediction_details(finals) -> dict:
    """Speculation's draft tokens in OpenAI's names (`usage.completion_tokens_details`): the
    accepted ones and the rejected ones, over the choices' last Timings (None: not done)."""
    done = [t for t in finals if t is not None]
    accepted = sum(t.accepted_tokens for t in done)
    return {"accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(t.drafted_tokens for t in done) - accepted}


def _too_long(e: ContextTooLong, max_param: str) -> APIError:
    """A 400 naming the larger share of the overflow: the prompt (`messages`) or the
    request's max-tokens field (`max_param`: a huge max_tokens is that field's fault)."""
    param = max_param if e.max_tokens > e.prompt_tokens else "messages"
    return APIError(400, str(e), "context_length_exceeded", param)


def _prepare(state, prompt, params: SamplingParams, images, namespace: str, max_param: str):
    """Token ids of a text prompt (context checked), or the messages as they are (images)."""
    if images:
        return prompt
    try:
        if state.chat_encodings is not None and _is_chat(prompt):
            tokens = state.chat_encodings.encode(prompt, namespace)
        else:
            tokens = state.backend.engine.encode(prompt)
    except GenerationError as e:
        raise APIError(400, str(e), "invalid_request", "messages") from None
    except Exception as e:  # noqa: BLE001 - a chat template refusing the messages
        raise APIError(400, f"The model's chat template cannot render these messages "
                            f"({type(e).__name__}: {e}).", "invalid_messages",
                       "messages") from None
    try:
        check_context(state.lm, len(tokens), params.max_tokens,
                      "shorten the messages or lower max_tokens")
    except ContextTooLong as e:
        raise _too_long(e, max_param) from None
    return tokens


def _is_chat(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(
        isinstance(m, dict) for m in prompt)


async def start(state, prompt, params: SamplingParams, namespace: str, images=None,
                n: int = 1, max_param: str = "max_tokens", follow_up: bool = False,
                speculate: str | None = None, drafts=()) -> list:
    """Submit `n` completions of `prompt` for `namespace`; their handles. `max_param` is the
    request's name for `params.max_tokens`, for a 400 that blames it. A `follow_up` prompt
    (a response's second node) is not counted again in the request's log line."""
    def submit(index: int, tokens):
        # Choices of one prompt differ by seed (as OpenAI's n does) when a seed is given.
        # (The engine's seed is an unsigned 64-bit integer: the sum wraps around.)
        p = replace(params, seed=(params.seed + index) % (1 << 64)) \
            if index and params.seed is not None else params
        try:
            return state.backend.submit(tokens, p, images, namespace, speculate=speculate,
                                        drafts=drafts)
        except QueueFull:
            raise APIError(429, f"The server's queue is full ({state.backend.max_queue} "
                                "requests in flight); retry shortly.", "queue_full") from None
        except ContextTooLong as e:
            raise _too_long(e, max_param) from None
        except GenerationError as e:
            raise APIError(400, str(e), "invalid_request") from None

    def prepare_and_submit() -> list:
        tokens = _prepare(state, prompt, params, images, namespace, max_param)
        handles = []
        try:
            for i in range(n):
                handles.append(submit(i, tokens))
        except BaseException:
            cancel(handles)
            raise
        return handles

    # One worker call for the prompt's tokens and its submits: each hop to a thread and back
    # waits for the GIL, which a busy engine or another request's tree work may hold. Shielded:
    # a client that goes away meanwhile cancels this await, not the submits, whose handles are
    # then cancelled when they land (else they would generate for nobody).
    task = asyncio.ensure_future(asyncio.to_thread(prepare_and_submit))
    try:
        handles = await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_cancel_landed)
        raise
    if not follow_up:
        logs.note_prompt(handles)
    return handles


def _cancel_landed(task) -> None:
    if not task.cancelled() and task.exception() is None:
        cancel(task.result())


def cancel(handles) -> None:
    """Cancel unfinished handles (the engine drops their rows at its next step)."""
    for h in handles:
        if not h.done:
            h.cancel()


async def events(state, handle, t0: float,
                 follow_up: bool = False) -> AsyncIterator[GenerationEvent]:
    """The handle's events; TTFT (not for a `follow_up`: the request's first token came
    before) and token counts into the metrics; cancel if left early."""
    first = not follow_up
    finished = False
    try:
        async for event in handle:
            if first and (event.token_ids or event.finish_reason):
                state.metrics.ttft(time.perf_counter() - t0)
                first = False
            state.metrics.tokens(len(event.token_ids))
            logs.note_event(handle, event)
            if event.finish_reason is not None:
                finished = True
            yield event
    finally:
        if not finished:
            state.metrics.cancel()
            cancel([handle])


async def interleaved(state, handles, t0: float):
    """The events of several handles (a request's choices) as they come, as (choice index,
    event, None) until every one has finished, or (index, None, error) once when one fails.
    Use it under `contextlib.aclosing`, so that leaving early stops the readers."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, handle):
        try:
            async for event in events(state, handle, t0):
                await queue.put((i, event, None))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which ends the stream
            await queue.put((i, None, e))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        left = len(handles)
        while left:
            i, event, error = await queue.get()
            yield i, event, error
            if error is not None:
                return
            if event.finish_reason is not None:
                left -= 1
    finally:
        for t in tasks:
            t.cancel()


def stream_error(error: BaseException) -> dict:
    """The SSE chunk that ends a stream whose generation failed (no details leak)."""
    return {"error": {"message": f"Generation failed ({type(error).__name__}).",
                      "type": "server_error", "param": None, "code": None}}


@dataclass(slots=True)
class Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    timings: Timings = field(default_factory=Timings)


async def collect(state, handle, t0: float) -> Collected:
    out, parts = Collected(), []
    async for event in events(state, handle, t0):
        parts.append(event.text)
        out.token_ids += event.token_ids
        out.logprobs += event.logprobs
        out.top_logprobs += event.top_logprobs
        if event.finish_reason is not None:
            out.finish_reason, out.timings = event.finish_reason, event.timings
    out.text = "".join(parts)
    return out


async def watch_disconnect(request, handles, every: float = 0.25) -> None:
    """Cancel `handles` when the client of a non-streaming request goes away."""
    while not all(h.done for h in handles):
        if await request.is_disconnected():
            state = request.app.state.forkv
            for h in handles:
                if not h.done:
                    state.metrics.cancel()
            cancel(handles)
            return
        await asyncio.sleep(every)
