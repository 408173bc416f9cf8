"""The Responses API's output: reasoning split from the answer, output items, stream events.

`Splitter` cuts a thinking model's generation at the format's close tag (the prompt already
opened the thought): text before it is reasoning, after it the answer; it works on streamed
deltas, holding back only what could be the start of the tag. `output_items` builds the
`reasoning` and `message` items; `stream_response` sends the SSE events the openai client
parses (`response.created` ... `response.completed`). Knows nothing about trees or the engine.
"""

from __future__ import annotations

from typing import Any

from .generation import events
from .sse import sse_response

__all__ = ["Splitter", "output_items", "stream_response"]


class Splitter:
    """Reasoning and answer text of one generation; `fmt` None means no reasoning."""

    def __init__(self, fmt):
        self.tag = fmt.close_tag if fmt is not None else None
        self.in_reasoning = self.tag is not None
        self.reasoning_parts: list[str] = []
        self.text_parts: list[str] = []
        self._held = ""

    def feed(self, delta: str) -> list[tuple[str, str]]:
        """New (kind, text) pieces, kind "reasoning" or "text"."""
        if not self.in_reasoning:
            return self._emit("text", delta)
        held = self._held + delta
        i = held.find(self.tag)
        if i >= 0:
            self.in_reasoning, self._held = False, ""
            return self._emit("reasoning", held[:i]) + self._emit("text", held[i + len(self.tag):])
        keep = max((k for k in range(1, len(self.tag)) if held.endswith(self.tag[:k])), default=0)
        self._held = held[len(held) - keep:] if keep else ""
        return self._emit("reasoning", held[:len(held) - keep])

    def finish(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        return self._emit("reasoning", held) if self.in_reasoning else []

    def _emit(self, kind: str, text: str) -> list[tuple[str, str]]:
        if not text:
            return []
        (self.reasoning_parts if kind == "reasoning" else self.text_parts).append(text)
        return [(kind, text)]

    @property
    def reasoning(self) -> str:
        # The format writes a newline before the close tag and blank lines after it.
        text = "".join(self.reasoning_parts)
        return text[:-1] if text.endswith("\n") and not self.in_reasoning else text

    @property
    def text(self) -> str:
        return "".join(self.text_parts).lstrip("\n")

    def num_reasoning_tokens(self, ids: list[int], tokenizer) -> int:
        """Generated tokens up to and including the close tag (all of them if it never came)."""
        if self.in_reasoning:
            return len(ids)
        tag_ids = tokenizer.encode(self.tag, add_special_tokens=False)
        for i in range(len(ids) - len(tag_ids) + 1):
            if ids[i:i + len(tag_ids)] == tag_ids:
                return i + len(tag_ids)
        return len(ids)


def _reasoning_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}] if status == "completed" else []}


def output_items(response_id: str, split: Splitter, reasoning: bool) -> list[dict]:
    rid = response_id.removeprefix("resp_")
    items = [_reasoning_item(rid, split.reasoning)] if reasoning else []
    return items + [_message_item(rid, split.text)]


def stream_response(state, handle, body: dict, split: Splitter, finish, t0: float):
    """SSE events of one response; `finish` writes the result into the tree at the end."""
    rid = body["id"].removeprefix("resp_")
    seq = iter(range(1 << 62))

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
                item = {**_reasoning_item(rid, "", "in_progress"), "content": []}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = _message_item(rid, "", "in_progress")
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

        finished, ids = False, []
        if split.tag:  # the reasoning item comes first in the output, even if left empty
            for e in open_item("reasoning"):
                yield e
        try:
            async for ev in events(state, handle, t0):
                ids += ev.token_ids
                pieces = split.feed(ev.text)
                if ev.finish_reason is not None:
                    pieces += split.finish()
                for kind, text in pieces:
                    if kind not in opened:
                        for e in open_item(kind):
                            yield e
                    yield delta(kind, text)
                if ev.finish_reason is not None:
                    if ev.finish_reason == "cancelled":
                        return
                    done = finish(split, ids, ev.finish_reason, ev.timings,
                                  len(handle.prompt_tokens))
                    finished = True
                    for kind in ("reasoning", "message") if split.tag else ("message",):
                        key = "reasoning" if kind == "reasoning" else "text"
                        if key not in opened:
                            for e in open_item(key):
                                yield e
                    for index, item in enumerate(done["output"]):
                        if item["type"] == "function_call":  # forkv.server.tools
                            yield event("response.output_item.added", output_index=index,
                                        item={**item, "arguments": "", "status": "in_progress"})
                            yield event("response.function_call_arguments.done",
                                        item_id=item["id"], output_index=index,
                                        arguments=item["arguments"])
                            yield event("response.output_item.done", output_index=index,
                                        item=item)
                            continue
                        part = item["content"][0]
                        name = part["type"]
                        yield event(f"response.{name}.done", item_id=item["id"],
                                    output_index=index, content_index=0, text=part["text"])
                        yield event("response.content_part.done", item_id=item["id"],
                                    output_index=index, content_index=0, part=part)
                        yield event("response.output_item.done", output_index=index, item=item)
                    kind = "response.completed" if done["status"] == "completed" else \
                        "response.incomplete"
                    yield event(kind, response=done)
        finally:
            if not finished:
                finish.abandon()

    return sse_response(chunks(), done=False)

