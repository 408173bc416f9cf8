"""The Responses API's stream: the SSE events the openai client parses, from a `ResponseRun`.

`response.created`, `response.in_progress`, then the output items as they fill: a thinking
model's `reasoning` item first (opened at once, even if it stays empty), the `message` item
when the answer's first text comes, each with its deltas; at the end the `.done` events of
every item (`function_call` items after the message) and `response.completed` (or
`response.incomplete`; `response.failed` if a node fails once the stream has begun). Knows
nothing about trees or the engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .errors import APIError
from .response_run import Cancelled, ResponseRun, message_item, reasoning_item
from .sse import sse_response

__all__ = ["stream_response"]


def stream_response(run: ResponseRun, body: dict):
    """SSE events of one response whose first node `run` has submitted."""
    rid = body["id"].removeprefix("resp_")
    seq = iter(range(1 << 62))
    run.streaming = True

    def event(kind: str, **fields: Any) -> tuple[str, dict]:
        return kind, {"type": kind, "sequence_number": next(seq), **fields}

    async def chunks():
        yield event("response.created", response=dict(body))
        yield event("response.in_progress", response=dict(body))
        opened: list[str] = []  # kinds whose item is open, in output order

        def open_item(kind: str):
            opened.append(kind)
            index = len(opened) - 1
            if kind == "reasoning":
                item = {**reasoning_item(rid, "", "in_progress"), "content": []}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = message_item(rid, "", "in_progress")
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            return [event("response.output_item.added", output_index=index, item=item),
                    event("response.content_part.added", item_id=item["id"],
                          output_index=index, content_index=0, part=part)]

        def delta(kind: str, text: str):
            index = opened.index(kind)
            name = "reasoning_text" if kind == "reasoning" else "output_text"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            prefix = "rs_" if kind == "reasoning" else "msg_"
            return event(f"response.{name}.delta", item_id=prefix + rid, output_index=index,
                         content_index=0, delta=text, **extra)

        kinds = ("reasoning", "message") if run.thinks else ("message",)
        if run.thinks:  # the reasoning item comes first in the output, even if left empty
            for e in open_item("reasoning"):
                yield e
        try:
            async with contextlib.aclosing(run.nodes()) as nodes:
                async for ev in nodes:
                    kind = "reasoning" if ev.kind == "reasoning" else "message"
                    if not ev.text:
                        continue
                    if kind not in opened:
                        for e in open_item(kind):
                            yield e
                    yield delta(kind, ev.text)
            done = run.finish()
        except Cancelled:
            return
        except Exception as e:  # noqa: BLE001 - the stream has begun: say so in it
            error = e if isinstance(e, APIError) else APIError(500, "Generation failed "
                                                              f"({type(e).__name__}).")
            yield event("response.failed", response={
                **body, "status": "failed",
                "error": {"code": error.code or "server_error", "message": error.message}})
            return
        finally:
            if not run.finished:
                run.abandon()
        for kind in kinds:
            if kind not in opened:
                for e in open_item(kind):
                    yield e
        for index, item in enumerate(done["output"]):
            if item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=index, arguments=item["arguments"])
                yield event("response.output_item.done", output_index=index, item=item)
                continue
            part = item["content"][0]
            name = part["type"]
            yield event(f"response.{name}.done", item_id=item["id"], output_index=index,
                        content_index=0, text=part["text"])
            yield event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part=part)
            yield event("response.output_item.done", output_index=index, item=item)
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        yield event(kind, response=done)

    return sse_response(chunks(), done=False)
