"""POST /v1/responses, GET and DELETE /v1/responses/{id}: responses as nodes of a tree.

Each response adds its input turns and generated nodes to its namespace's conversation tree
(`conversations`); `previous_response_id` continues, or with a second request forks, from that
response, and the engine restores the shared path from checkpoints
(`usage.input_tokens_details.cached_tokens`). `instructions` is the system node. On models with
a thinking format the reasoning comes back as a `reasoning` item before the message. `store:
false` removes the nodes (and checkpoints only they used) once answered. The generated nodes
run in `response_run` through the SDK's node runner (as Session's do); streaming events are
built in `response_events`. Knows the request's wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from forkv.engine import SamplingParams
from forkv.graph import ReasoningFormat
from forkv.runner import gen_settings
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from .auth import namespace_of
from .conversations import Stored, Turn
from .errors import APIError
from .inputs import (
    DEFAULT_MAX_TOKENS,
    Sampling,
    decode_image,
    parse_body,
    read_json,
    sampling_params,
)
from .response_events import stream_response
from .response_run import Cancelled, ResponseRun, tree_work
from .tools import TOOL_ITEMS, ToolPlan, name_tool_results, plan_tools, tool_turn

__all__ = ["create_response", "delete_response", "get_response"]

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
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an object (a message or a tool item).",
                           "invalid_value", where)
        if item.get("type") in TOOL_ITEMS:
            turns.append(tool_turn(item, where))
            continue
        role = item.get("role")
        kind = _KINDS.get(role) if isinstance(role, str) else None
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
    params = sampling_params(req, req.max_output_tokens)
    turns = to_turns(req.input, state.can_see_images)
    gens = _node_gens(params, plan, state.reasoning, req.speculate)
    tree = conv.tree(ns)

    def add() -> tuple[str, list[str]]:
        first, gen_ids = conv.add_turns(ns, previous, req.instructions, turns, gens)
        if plan.specs:  # declared on this request's first node: seen by what it generates
            tree[first].tools = plan.specs
        # the nodes this request added (those above were named when they were added)
        path = tree.path(gen_ids[0])
        i = len(path) - 1
        while path[i].id != first:  # (from the end: a deep chat's path is not walked)
            i -= 1
        name_tool_results(tree, [n.id for n in path[i:]])
        return first, gen_ids

    first, gen_ids = await tree_work(tree, add)  # beside other requests' renders of this tree
    stored = Stored(f"resp_{uuid.uuid4().hex}", ns, first, gen_ids[-1])
    body = {"id": stored.id, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": req.model, "output": [],
            "previous_response_id": req.previous_response_id,
            "instructions": req.instructions, "store": req.store,
            "temperature": params.temperature, "top_p": params.top_p,
            "max_output_tokens": req.max_output_tokens or DEFAULT_MAX_TOKENS,
            "parallel_tool_calls": plan.parallel,
            "tool_choice": raw.get("tool_choice", plan.choice),
            "tools": req.tools or [], "error": None,
            "incomplete_details": None, "metadata": req.metadata or {}, "usage": None,
            "text": {"format": plan.format_info}, "reasoning": None}
    stored.body = body
    run = ResponseRun(state, stored, req.store, gen_ids, time.perf_counter())
    try:
        await run.begin()
    except BaseException:
        await tree_work(tree, conv.remove, ns, first)
        raise
    conv.keep(stored)  # visible (in progress) so a fork cannot race ahead of it
    if req.stream:
        return stream_response(run, body)
    watcher = asyncio.create_task(run.watch(request))
    try:
        async with contextlib.aclosing(run.nodes()) as nodes:
            async for _ in nodes:
                pass
    except Cancelled:
        run.abandon()
        raise APIError(499, "The client closed the request.", "cancelled") from None
    except BaseException:
        run.abandon()
        raise
    finally:
        watcher.cancel()
    return JSONResponse(run.finish())


def _node_gens(params: SamplingParams, plan: ToolPlan, fmt: ReasoningFormat | None,
               speculate: str | None = None) -> dict:
    """The settings of the nodes a response generates: every sampling field of the request
    (logit_bias, seed... as the sampler knows them) on each; the answer alone takes the stop
    strings, tool choice and output format, the thought stops at the close tag."""
    try:
        final = gen_settings(params, constraint=plan.constraint, tool_choice=plan.choice,
                             parallel_tool_calls=plan.parallel, speculate=speculate)
        if fmt is None:
            return {"final": final}
        return {"reasoning": gen_settings(params, stop=(fmt.close_tag,), speculate=speculate),
                "final": final}
    except ValueError as e:  # a value the sampler takes but a node does not (pydantic's)
        raise APIError(400, f"The sampling settings do not fit a node: {e}",
                       "invalid_value") from None


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
    conv = state.conversations

    def remove() -> tuple[list[str], set[str]]:
        busy = conv.busy_under(ns, stored.first)
        if busy:
            raise APIError(400, f"Response {busy[0]!r} in this subtree is still generating; "
                                "delete once it has finished.", "response_in_progress")
        return conv.remove(ns, stored.first)

    gone, keys = await tree_work(conv.tree(ns), remove)
    released = state.backend.release(keys, ns)
    return JSONResponse({"id": stored.id, "object": "response", "deleted": True,
                         "deleted_responses": gone, "released_records": released})
