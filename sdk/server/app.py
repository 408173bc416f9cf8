"""The ASGI application: server state, routes, request metrics, lifetime.

`make_app(state)` returns a Starlette app serving /v1/chat/completions, /v1/responses(/{id}),
/v1/models, /health and /metrics for one loaded model. `ServerState` holds what every route
needs (backend, tenants, conversations, metrics, the model's names and formats). Knows how
the pieces are wired, not what any endpoint does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from forkv.graph import ReasoningFormat

from .auth import Tenants
from .backend import Backend
from .chat import chat_completions
from .conversations import Conversations
from .errors import APIError, install_handlers
from .metrics import Metrics
from .responses import create_response, delete_response, get_response

__all__ = ["ServerConfig", "ServerState", "make_app"]

DEFAULT_MAX_BODY = 32 << 20  # room for a few base64 images


@dataclass(slots=True)
class ServerConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    max_queue: int = 64
    max_seqs: int = 8
    max_namespaces: int = 8
    max_body: int = DEFAULT_MAX_BODY
    reasoning: str = "auto"  # auto | on | off: emit reasoning items for thinking formats
    aliases: tuple[str, ...] = field(default_factory=tuple)
    chat_template: object = None  # Jinja text or a file, for a model that ships none


class ServerState:
    def __init__(self, config: ServerConfig, lm, backend: Backend | None = None):
        self.config, self.lm = config, lm
        self.backend = backend or Backend(lm, max_queue=config.max_queue,
                                          max_seqs=config.max_seqs,
                                          max_namespaces=config.max_namespaces)
        self.metrics = Metrics()
        self.tenants = Tenants(config.api_keys)
        self.model_ids = dict.fromkeys((config.model, lm.name, *config.aliases))
        self.fingerprint = f"forkv-{lm.fingerprint.hex()[:12]}"
        self.conversations = Conversations(f"{lm.name}@{lm.fingerprint.hex()[:12]}")
        self.can_see_images = bool(getattr(lm, "is_vision", False))
        self.plain_format = ReasoningFormat()
        self.reasoning = _reasoning_format(lm.tokenizer, config.reasoning)
        self.template_kwargs: dict = {}
        self.started = time.time()

    def check_model(self, name: str) -> None:
        if name not in self.model_ids:
            raise APIError(404, f"The model {name!r} is not served here; use "
                                f"{next(iter(self.model_ids))!r} (GET /v1/models lists it).",
                           "model_not_found", "model")


def _reasoning_format(tokenizer, mode: str) -> ReasoningFormat | None:
    """The thinking format of the model's tokenizer (mlx-lm detects it), if reasoning is on."""
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if mode == "off" or (mode == "auto" and not (start and end)):
        return None
    if start and end:
        return ReasoningFormat(open=f"{start}\n", close=f"\n{end}\n\n")
    return ReasoningFormat()


# -- small routes ---------------------------------------------------------------------------
async def health(request: Request):
    state = request.app.state.forkv
    return JSONResponse({"status": "ok", "model": state.config.model})


async def list_models(request: Request):
    state = request.app.state.forkv
    state.tenants.tenant(request.headers.get("authorization"))
    return JSONResponse({"object": "list", "data": [_model(state, m) for m in state.model_ids]})


async def get_model(request: Request):
    state = request.app.state.forkv
    state.tenants.tenant(request.headers.get("authorization"))
    name = request.path_params["model"]
    state.check_model(name)
    return JSONResponse(_model(state, name))


def _model(state, name: str) -> dict:
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "forkv",
            "context_length": state.lm.context_length}


async def metrics(request: Request):
    state = request.app.state.forkv
    stats = await asyncio.to_thread(state.backend.stats)
    return PlainTextResponse(state.metrics.render(stats),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/responses": "responses",
              "/v1/models": "models", "/health": "health", "/metrics": "metrics"}


class _CountRequests:
    """ASGI middleware: count answered requests by endpoint and status."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = _ENDPOINTS.get(path) or (
            "responses" if path.startswith("/v1/responses/") else
            "models" if path.startswith("/v1/models/") else "other")

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.state.metrics.request(endpoint, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


def make_app(state: ServerState) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(state.backend.engine, "")  # ready before /health answers
        try:
            yield
        finally:
            await asyncio.to_thread(state.backend.close)

    routes = [
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/models", list_models),
        Route("/v1/models/{model:path}", get_model),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.forkv = state
    install_handlers(app)
    app.add_middleware(_CountRequests, state=state)
    return app
