"""The web app: its static files at `/`, and a read-only view of the Responses trees it browses.

The page (`static/`: plain HTML, CSS and ES modules, no build step) chats through the Responses
API itself: a turn is one response, `previous_response_id` hangs it under an earlier turn, so
regenerate and edit are a second response under the same parent (a sibling), and DELETE
/v1/responses/ID prunes a turn's subtree and releases the checkpoints only it used. What the
API lacks is a way to list them; this module adds it:

- `GET /v1/forkv/conversations`: the calling tenant's conversations on every loaded model.
- `GET /v1/forkv/conversations/{id}`: one conversation's turns (parent, texts, images as
  data URLs, status, usage and each generated node's engine stats: tokens restored /
  computed / generated, time to first token, tok/s).

A conversation is the set of turns whose `metadata.conversation` names it (the page sets it,
so that an edited first message is a sibling too), else the tree of one root response.
Everything is read from the server's memory; nothing here writes or logs a conversation.
Knows the wire format of these two routes, not how a response runs.
"""

from __future__ import annotations

import base64
import re
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .conversations import Stored
from .errors import APIError

__all__ = ["WEBAPP_ROUTES", "conversation_id", "turn_of"]

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_ASSET = re.compile(r"[a-z][a-z0-9_]*\.(js|css|svg)")
_TITLE_CHARS = 80
_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/bmp", "image/webp"})


def _read(name: str) -> bytes:
    """A shipped file's bytes; a 404 APIError where none is."""
    file = resources.files("forkv.server").joinpath("static", name)
    if not file.is_file():
        raise APIError(404, f"The web app has no file {name!r}.", "not_found")
    return file.read_bytes()


async def index(request: Request) -> Response:
    return Response(_read("index.html"), media_type=_TYPES[".html"])


async def asset(request: Request) -> Response:
    """GET /app/NAME: a script, stylesheet or icon of the page (the page itself is at /)."""
    name = request.path_params["name"]
    if not _ASSET.fullmatch(name):
        raise APIError(404, f"The web app has no file {name!r}.", "not_found")
    return Response(_read(name), media_type=_TYPES["." + name.rsplit(".", 1)[-1]])


# -- conversations ------------------------------------------------------------------------
def conversation_id(stored: Stored, by_id: dict[str, Stored]) -> str:
    """The conversation a response belongs to: its `metadata.conversation`, else its root's
    id (a response whose parent is gone is a root)."""
    cid = (stored.body.get("metadata") or {}).get("conversation")
    if isinstance(cid, str) and cid:
        return cid
    seen = set()
    while True:
        prev = stored.body.get("previous_response_id")
        if prev not in by_id or prev in seen:
            return stored.id
        seen.add(prev)
        stored = by_id[prev]
        cid = (stored.body.get("metadata") or {}).get("conversation")
        if isinstance(cid, str) and cid:
            return cid


def turn_of(tree, stored: Stored) -> dict:
    """One response as a turn: its input and generated nodes' texts, usage, per-node stats."""
    nodes = []
    node = tree[stored.last] if stored.last in tree else None  # noqa: SIM401 - a Tree
    while node is not None:
        nodes.append(node)
        if node.id == stored.first:
            break
        node = tree.parent(node)
    nodes.reverse()
    body = stored.body
    given = [n for n in nodes if not n.is_generated]
    gens = [n for n in nodes if n.is_generated]
    return {
        "id": stored.id, "previous": body.get("previous_response_id"),
        "created_at": body.get("created_at"), "model": body.get("model"),
        "status": body.get("status") if stored.done else "in_progress",
        "instructions": body.get("instructions"),
        "input": "\n\n".join(n.text or "" for n in given if n.kind == "user"),
        "images": [_data_url(p) for n in given if n.kind == "user" for p in n.images
                   if p.data is not None and p.mime in _IMAGE_TYPES],
        "reasoning": next((n.text or "" for n in gens if n.kind == "reasoning"), None),
        "output": next((n.text or "" for n in gens if n.kind == "final"), ""),
        "usage": body.get("usage"),
        "nodes": [_node_stats(n) for n in gens],
    }


def _data_url(image) -> str:
    return f"data:{image.mime};base64,{base64.b64encode(image.data).decode()}"


def _node_stats(node) -> dict:
    out = {"id": node.id, "kind": node.kind, "status": node.status}
    if node.result is not None:
        s, t = node.result.stats, node.result.timings
        out.update(tokens_restored=s.tokens_reused, tokens_computed=s.tokens_computed,
                   tokens_generated=s.tokens_generated,
                   ttft_s=t.get("first_token_s"), decode_tps=t.get("decode_tps"),
                   restore_s=t.get("restore_s"), prefill_s=t.get("prefill_s"))
    return out


def _namespace(request: Request) -> str:
    state = request.app.state.forkv
    return state.tenants.tenant(request.headers.get("authorization"))  # no cache_salt here


def _grouped(request: Request) -> dict[str, tuple]:
    """conversation id -> (served model, its responses) for the calling tenant."""
    ns = _namespace(request)
    out: dict[str, tuple] = {}
    for served in request.app.state.forkv.models.loaded:
        responses = served.conversations.responses(ns)
        by_id = {s.id: s for s in responses}
        for stored in responses:
            cid = conversation_id(stored, by_id)
            out.setdefault(cid, (served, []))[1].append(stored)
    return out


async def list_conversations(request: Request) -> JSONResponse:
    data = []
    for cid, (served, responses) in _grouped(request).items():
        first = min(responses, key=lambda s: s.body.get("created_at") or 0)
        tree = served.conversations.tree(first.namespace)
        title = turn_of(tree, first)["input"].strip().splitlines()[:1]
        data.append({"id": cid, "model": first.body.get("model"), "turns": len(responses),
                     "created_at": first.body.get("created_at"),
                     "title": title[0][:_TITLE_CHARS] if title else ""})
    data.sort(key=lambda c: c["created_at"] or 0, reverse=True)
    return JSONResponse({"object": "list", "data": data})


async def get_conversation(request: Request) -> JSONResponse:
    cid = request.path_params["conversation_id"]
    found = _grouped(request).get(cid)
    if found is None:
        raise APIError(404, f"No conversation {cid!r} here (deleted, made with another API key, "
                            "or its model was unloaded).", "conversation_not_found")
    served, responses = found
    tree = served.conversations.tree(responses[0].namespace)
    turns = sorted((turn_of(tree, s) for s in responses), key=lambda t: t["created_at"] or 0)
    return JSONResponse({"id": cid, "object": "conversation", "model": turns[0]["model"],
                         "turns": turns})


WEBAPP_ROUTES = [
    Route("/", index, methods=["GET"]),
    Route("/app/{name}", asset, methods=["GET"]),
    Route("/v1/forkv/conversations", list_conversations, methods=["GET"]),
    Route("/v1/forkv/conversations/{conversation_id}", get_conversation, methods=["GET"]),
]
