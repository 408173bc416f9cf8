"""Server-sent events: the wire format of streamed completions, and a response that sends them.

`event_stream(chunks)` turns an async iterator of JSON-ready dicts (or `(event_name, dict)`
pairs, as the Responses API names its events) into SSE frames; chat completions end with
`data: [DONE]`. When the client goes away Starlette cancels the iterator, whose own `finally`
cancels the engine request. Knows nothing about models.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

__all__ = ["DONE", "event_stream", "frame", "sse_response"]

DONE = "data: [DONE]\n\n"


def frame(data: dict, event: str | None = None) -> str:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {body}\n\n"


async def event_stream(chunks: AsyncIterator, done: bool = True) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield frame(chunk[1], chunk[0]) if isinstance(chunk, tuple) else frame(chunk)
    if done:
        yield DONE


def sse_response(chunks: AsyncIterator, done: bool = True) -> StreamingResponse:
    return StreamingResponse(event_stream(chunks, done), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
