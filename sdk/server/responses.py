"""POST /v1/responses, GET and DELETE /v1/responses/{id}: responses as nodes of a tree.

Each response adds its input turns and generated nodes to its namespace's conversation tree
(`conversations`); `previous_response_id` continues, or with a second request forks, from that
response, and the engine restores the shared path from checkpoints
(`usage.input_tokens_details.cached_tokens`). `instructions` is the system node. On models with
a thinking format the reasoning comes back as a `reasoning` item before the message. `store:
false` removes the nodes (and checkpoints only they used) once answered. Streaming events are
built in `response_events`. Knows the wire format; the engine work is in `generation`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from forkv.graph import render
from forkv.runner import path_images, record_render

from .auth import namespace_of
from .conversations import Stored, Turn
from .errors import APIError
from .generation import collect, start, watch_disconnect
from .inputs import (DEFAULT_MAX_TOKENS, Sampling, decode_image, parse_body, read_json,
                     sampling_params)
from .response_events import Splitter, output_items, stream_response
from .tools import TOOL_ITEMS, attach_calls, name_tool_results, plan_tools, tool_turn

__all__ = ["create_response", "delete_response", "get_response"]

_log = logging.getLogger(__name__)
_KINDS = {"user": "user", "assistant": "final", "system": "system", "developer": "system"}


class ResponsesRequest(Sampling):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    cache_salt: str | None = None
    tools: list[Any] | None = None
    metadata: dict[str, Any] | None = None


def to_turns(items: str | list[dict], can_see: bool) -> list[Turn]:
    if isinstance(items, str):
        return [Turn("user", items)]
    turns = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if item.get("type") in TOOL_ITEMS:
            turns.append(tool_turn(item, where))
            continue
        kind = _KINDS.get(item.get("role"))
        if item.get("type", "message") != "message" or kind is None:
            raise APIError(400, f"{where} must be a message with role user, assistant, system "
                                "or developer (other item types are not supported).",
                           "invalid_value", where)
        content = item.get("content")
        if isinstance(content, str):
            turns.append(Turn(kind, content))
            continue
        if not isinstance(content, list):
            raise APIError(400, f"{where}.content must be a string or a list of parts.",
                           "invalid_value", f"{where}.content")
        text, images = [], []
        for j, part in enumerate(content):
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype in ("input_text", "output_text", "text"):
                text.append(str(part.get("text", "")))
            elif ptype == "input_image" and kind == "user":
                if not can_see:
                    raise APIError(400, f"{where}.content[{j}] is an image, but this model is "
                                        "text-only; drop the image or serve a vision model.",
                                   "image_not_supported", f"{where}.content[{j}]")
                images.append(decode_image(part.get("image_url"), f"{where}.content[{j}]"))
            else:
                raise APIError(400, f"{where}.content[{j}].type {ptype!r} is not supported here; "
                                    "use input_text (or input_image in user turns).",
                               "invalid_value", f"{where}.content[{j}]")
        turns.append(Turn(kind, "".join(text), images))
    if not turns:
        raise APIError(400, "input is empty; give at least one message.", "invalid_value",
                       "input")
    return turns


async def create_response(request: Request) -> Any:
    state = request.app.state.forkv
    tenant = state.tenants.tenant(request.headers.get("authorization"))
    raw = await read_json(request, state.config.max_body)
    req = parse_body(ResponsesRequest, raw)
    state = await state.model(req.model)  # the model it names (loaded on demand)
    plan = plan_tools(raw, state.lm.tokenizer)  # tools, tool_choice, text.format
    ns = namespace_of(tenant, req.cache_salt)
    conv = state.conversations
    previous = conv.get(ns, req.previous_response_id) if req.previous_response_id else None
    params = plan.apply(sampling_params(req, req.max_output_tokens))
    gen = {"max_tokens": params.max_tokens, "temperature": params.temperature,
           "top_p": params.top_p, "top_k": params.top_k, "seed": params.seed,
           "stop": params.stop}
    fmt = state.reasoning
    turns = to_turns(req.input, state.can_see_images)
    first, gen_ids = conv.add_turns(ns, previous, req.instructions, turns, fmt is not None, gen)
    tree = conv.tree(ns)
    if plan.specs:  # declared on this request's first node: seen by what it generates
        tree[first].tools = plan.specs
    name_tool_results(tree, [n.id for n in tree.path(gen_ids[0])])
    stored = Stored(f"resp_{uuid.uuid4().hex}", ns, first, gen_ids[-1])
    body = {"id": stored.id, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": req.model, "output": [],
            "previous_response_id": req.previous_response_id,
            "instructions": req.instructions, "store": req.store,
            "temperature": params.temperature, "top_p": params.top_p,
            "max_output_tokens": req.max_output_tokens or DEFAULT_MAX_TOKENS,
            "parallel_tool_calls": plan.parallel, "tool_choice": raw.get("tool_choice", plan.choice),
            "tools": req.tools or [], "error": None,
            "incomplete_details": None, "metadata": req.metadata or {}, "usage": None,
            "text": {"format": plan.format_info}, "reasoning": None}
    stored.body = body
    try:
        prompt = render(tree, gen_ids[0], state.lm.tokenizer, fmt or state.plain_format,
                        template_kwargs=state.template_kwargs)
        images = path_images(tree, gen_ids[0])
        t0 = time.perf_counter()
        handles = await start(state, prompt.token_ids, params, ns, images or None,
                              max_param="max_output_tokens")
    except BaseException:
        conv.remove(ns, first)
        raise
    conv.keep(stored)  # visible (in progress) so a fork cannot race ahead of it
    finish = _Finisher(state, stored, req.store, gen_ids, fmt, plan)
    if req.stream:
        finish.streaming = True
        return stream_response(state, handles[0], body, Splitter(fmt), finish, t0)
    watcher = asyncio.create_task(watch_disconnect(request, handles))
    try:
        result = await collect(state, handles[0], t0)
    except BaseException:
        finish.abandon()
        raise
    finally:
        watcher.cancel()
    if result.finish_reason == "cancelled":
        finish.abandon()
        raise APIError(499, "The client closed the request.", "cancelled")
    splitter = Splitter(fmt)
    splitter.feed(result.text)
    splitter.finish()
    finish(splitter, result.token_ids, result.finish_reason, result.timings,
           len(handles[0].prompt_tokens))
    return JSONResponse(body)


class _Finisher:
    """Writes a finished generation into the tree and the response body (or drops both)."""

    def __init__(self, state, stored: Stored, keep: bool, gen_ids: list[str], fmt, plan):
        self.state, self.stored, self.keep, self.gen_ids, self.fmt = state, stored, keep, \
            gen_ids, fmt
        self.plan, self.streaming = plan, False

    def __call__(self, split: Splitter, ids: list[int], finish: str, timings,
                 prompt_tokens: int) -> dict:
        state, stored = self.state, self.stored
        tree = state.conversations.tree(stored.namespace)
        n_reason = split.num_reasoning_tokens(ids, state.lm.tokenizer) if self.fmt else 0
        reason = "max_output_tokens" if finish == "length" else None
        if self.fmt is not None:
            tree.attach(self.gen_ids[0], split.reasoning, ids[:n_reason], finish, stats=None)
        tree.attach(self.gen_ids[-1], split.text, ids[n_reason:], finish)
        content, calls = attach_calls(self.plan, tree[self.gen_ids[-1]], split.text)
        body = stored.body
        body["output"] = output_items(stored.id, split, self.fmt is not None)
        if calls:  # function_call items follow the message (kept if it has text or streamed)
            body["output"] = [i for i in body["output"] if i["type"] != "message" or content
                              or self.streaming]
            for item in body["output"]:
                if item["type"] == "message":
                    item["content"][0]["text"] = content
            body["output"] += calls
        body["status"] = "incomplete" if reason else "completed"
        body["incomplete_details"] = {"reason": reason} if reason else None
        body["usage"] = {"input_tokens": prompt_tokens,
                         "input_tokens_details": {"cached_tokens": timings.reused_tokens},
                         "output_tokens": len(ids),
                         "output_tokens_details": {"reasoning_tokens": n_reason},
                         "total_tokens": prompt_tokens + len(ids)}
        stored.done = True
        if self.keep:
            try:
                _record_keys(state, tree, stored)
            except Exception:  # noqa: BLE001 - bookkeeping for DELETE only; the answer stands
                _log.warning("could not record the block keys of %s", stored.id, exc_info=True)
        else:
            self.abandon()
        return body

    def abandon(self) -> None:
        """Remove this response's nodes and release the checkpoints only they used."""
        stored = self.stored
        try:
            _, keys = self.state.conversations.remove(stored.namespace, stored.first)
        except Exception:  # noqa: BLE001 - already removed (a DELETE got there first)
            return
        self.state.backend.release(keys, stored.namespace)


def _record_keys(state, tree, stored: Stored) -> None:
    """Store each node's span and checkpoint keys of the finished path, so that a DELETE can
    tell which checkpoints only its subtree used."""
    rendered = render(tree, stored.last, state.lm.tokenizer, state.reasoning or
                      state.plain_format, template_kwargs=state.template_kwargs)
    record_render(state.backend.engine, tree, rendered, namespace=stored.namespace)


async def get_response(request: Request) -> Any:
    state = request.app.state.forkv
    tenant = state.tenants.tenant(request.headers.get("authorization"))
    ns = namespace_of(tenant, request.query_params.get("cache_salt"))
    _, stored = state.find_response(ns, request.path_params["response_id"])
    return JSONResponse(stored.body)


async def delete_response(request: Request) -> Any:
    """Remove a response and every response built on it; release checkpoints only they used."""
    state = request.app.state.forkv
    tenant = state.tenants.tenant(request.headers.get("authorization"))
    ns = namespace_of(tenant, request.query_params.get("cache_salt"))
    state, stored = state.find_response(ns, request.path_params["response_id"])
    busy = state.conversations.busy_under(ns, stored.first)
    if busy:
        raise APIError(400, f"Response {busy[0]!r} in this subtree is still generating; delete "
                            "once it has finished.", "response_in_progress")
    gone, keys = state.conversations.remove(ns, stored.first)
    released = state.backend.release(keys, ns)
    return JSONResponse({"id": stored.id, "object": "response", "deleted": True,
                         "deleted_responses": gone, "released_records": released})
