"""POST /v1/chat/completions: OpenAI chat messages in, one or n choices out, JSON or SSE.

Knows the chat-completions wire format: message roles and content parts (text, `image_url`
as data: URLs for vision models), `max_tokens`/`max_completion_tokens`, sampling fields, `n`
(n choices of one prompt: forks that share its checkpoints, decoded in one batch),
`logprobs`/`top_logprobs`, `stream` with `stream_options.include_usage`, and `usage` with
`prompt_tokens_details.cached_tokens` = prompt tokens restored from checkpoints. The engine
work is in `generation`; tenants in `auth`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from .auth import namespace_of
from .errors import APIError
from .generation import (
    collect,
    interleaved,
    prediction_details,
    start,
    stream_error,
    watch_disconnect,
)
from .inputs import Sampling, decode_image, parse_body, read_json, sampling_params
from .sse import sse_response
from .tools import CallStream, history, plan_tools

__all__ = ["chat_completions"]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}


class ChatRequest(Sampling):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = Field(1, ge=1, le=16)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    cache_salt: str | None = None


def to_engine_messages(messages: list[dict], can_see: bool) -> tuple[list[dict], list[bytes]]:
    """Engine chat messages and the images they carry, in order (400 on bad messages)."""
    out, images = [], []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        role = _ROLES.get(role) if isinstance(role, str) else None
        if role is None:
            raise APIError(400, f"messages[{i}].role must be one of {', '.join(_ROLES)}.",
                           "invalid_value", f"messages[{i}].role")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts, has_image = [], False
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                where = f"messages[{i}].content[{j}]"
                if kind in ("text", "input_text", "output_text"):
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif kind in ("image_url", "input_image"):
                    if not can_see:
                        raise APIError(400, f"{where} is an image, but this model is text-only; "
                                            "drop the image or serve a vision model.",
                                       "image_not_supported", where)
                    images.append(decode_image(part.get("image_url"), where))
                    parts.append({"type": "image"})
                    has_image = True
                else:
                    raise APIError(400, f"{where}.type {kind!r} is not supported; use text or "
                                        "image_url.", "invalid_value", where)
            content = parts if has_image else "".join(p["text"] for p in parts)
        elif not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of parts.",
                           "invalid_value", f"messages[{i}].content")
        msg = {"role": role, "content": content}
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        out.append(msg)
    return out, images


def _logprobs(tokenizer, ids: list[int], lps: list[float], tops: list[dict]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8"))}

    content = []
    for k, (tid, lp) in enumerate(zip(ids, lps)):
        item = entry(tid, lp)
        top = tops[k] if k < len(tops) else {}
        item["top_logprobs"] = [entry(t, v) for t, v in top.items()]
        content.append(item)
    return {"content": content, "refusal": None}


async def chat_completions(request: Request) -> Any:
    state = request.app.state.forkv
    tenant = state.tenants.tenant(request.headers.get("authorization"))
    body = await read_json(request, state.config.max_body)
    req = parse_body(ChatRequest, body)
    state = await state.model(req.model)  # the model it names (loaded on demand)
    plan = plan_tools(body, state.lm.tokenizer)  # tools, tool_choice, response_format
    namespace = namespace_of(tenant, req.cache_salt)
    top = req.top_logprobs or 0
    if top and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true.", "invalid_value",
                       "top_logprobs")
    params = plan.apply(sampling_params(req, req.max_completion_tokens or req.max_tokens, top))
    messages, images = to_engine_messages(req.messages, state.can_see_images)
    prompt = plan.prompt(state.lm.tokenizer, history(req.messages, messages),
                         state.template_kwargs, images)
    t0 = time.perf_counter()
    handles = await start(state, prompt, params, namespace, images or None, req.n,
                          "max_completion_tokens" if req.max_completion_tokens else "max_tokens",
                          speculate=req.speculate)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": req.model, "system_fingerprint": state.fingerprint}
    tok = state.lm.tokenizer
    if req.stream:
        usage = bool((req.stream_options or {}).get("include_usage"))
        return sse_response(_stream(state, handles, head, usage, req.logprobs, tok, t0, plan))
    watcher = asyncio.create_task(watch_disconnect(request, handles))
    try:
        results = await asyncio.gather(*(collect(state, h, t0) for h in handles))
    finally:
        watcher.cancel()
    messages = [plan.message(r.text) for r in results]
    choices = [{"index": i, "message": messages[i][0],
                "logprobs": _logprobs(tok, r.token_ids, r.logprobs, r.top_logprobs)
                if req.logprobs else None,
                "finish_reason": messages[i][1] or _finish(r.finish_reason)}
               for i, r in enumerate(results)]
    usage = _usage(handles, [r.timings for r in results], sum(len(r.token_ids) for r in results))
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": usage})


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _usage(handles, finals: list, completion: int) -> dict:
    """`finals`: each choice's last Timings (None while it runs)."""
    prompt = len(handles[0].prompt_tokens)
    # The choices share one prompt: count it once, cached as the first choice found it.
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": finals[0].reused_tokens
                                      if finals and finals[0] else 0},
            "completion_tokens_details": prediction_details(finals)}


async def _stream(state, handles, head, include_usage: bool, logprobs: bool, tok, t0, plan):
    calls = [CallStream(plan) for _ in handles]  # holds back text once a tool call starts
    finals, generated = [None] * len(handles), [0] * len(handles)

    def chunk(choices, usage=None):
        body = {**head, "object": "chat.completion.chunk", "choices": choices}
        if include_usage:
            body["usage"] = usage
        return body

    async with contextlib.aclosing(interleaved(state, handles, t0)) as stream:
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                      "logprobs": None, "finish_reason": None} for i in range(len(handles))])
        async for i, event, error in stream:
            if error is not None:
                yield stream_error(error)
                return
            generated[i] += len(event.token_ids)
            text, deltas = calls[i].feed(event.text), []
            if event.finish_reason is not None:
                rest, deltas = calls[i].finish()
                text += rest
            delta = {"content": text} if text else {}
            if deltas:
                delta["tool_calls"] = deltas
            choice = {"index": i, "delta": delta,
                      "logprobs": _logprobs(tok, event.token_ids, event.logprobs,
                                            event.top_logprobs)
                      if logprobs else None, "finish_reason": None}
            if event.finish_reason is not None:
                finals[i] = event.timings
                choice["finish_reason"] = "tool_calls" if deltas else _finish(event.finish_reason)
            if text or event.finish_reason is not None or logprobs:
                yield chunk([choice])
        if include_usage:
            yield chunk([], _usage(handles, finals, sum(generated)))
