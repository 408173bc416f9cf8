"""The ASGI application: server state, routes, request metrics, lifetime.

`make_app(state)` returns a Starlette app serving /v1/chat/completions, /v1/completions,
/v1/responses(/{id}), /v1/models, /health, /metrics and the web app (`webapp`: / and
/v1/forkv/conversations), behind `guard` (Host, Origin, content type, API key, security
headers). `ServerState` holds what every route needs: the config, tenants and metrics, and the
models (`models.ModelPool`; a route gets the `ServedModel` its request names with `await
state.model(name)`). Knows how the pieces are wired, not what any endpoint does.
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

from .auth import Tenants
from .chat import chat_completions
from .completions import completions
from .errors import APIError, install_handlers
from .guard import Guard, Policy, SecureHeaders
from .logs import AccessLog, note_model
from .metrics import Metrics
from .models import DEFAULT_MAX_MODELS, ModelPool, ServedModel, model_card
from .responses import create_response, delete_response, get_response
from .served_engine import ServedEngine
from .webapp import WEBAPP_ROUTES

__all__ = ["ServerConfig", "ServerState", "make_app"]

DEFAULT_MAX_BODY = 32 << 20  # room for a few base64 images


@dataclass(slots=True)
class ServerConfig:
    model: str | None = None  # pinned and served alone; None: any name, on demand
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    max_queue: int = 64
    max_seqs: int = 8
    reuse: str = "fast"  # exact | fast: how requests reuse earlier computation (live.py)
    speculate: str = "auto"  # auto | on | off: exact speculative decoding (speculate.py)
    max_body: int = DEFAULT_MAX_BODY
    reasoning: str = "auto"  # auto | on | off: emit reasoning items for thinking formats
    aliases: tuple[str, ...] = field(default_factory=tuple)
    chat_template: object = None  # Jinja text or a file, for a model that ships none
    models: tuple[str, ...] = ()  # several pinned models (then any other name on demand too)
    max_models: int = DEFAULT_MAX_MODELS  # loaded at once, pinned ones included
    model_memory: int | None = None  # bytes of weights loaded at once (None: no budget)
    allow_origins: tuple[str, ...] = ()  # other sites' pages that may call (guard.py)

    @property
    def on_demand(self) -> bool:
        return len(self.pinned) != 1

    @property
    def pinned(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(((self.model,) if self.model else ()) + self.models))


class ServerState:
    """What every route needs. `lm` (and `backend`) pin that loaded model as `config.model`;
    `serve()` loads and pins `config.pinned` itself."""

    def __init__(self, config: ServerConfig, lm=None, backend: ServedEngine | None = None):
        self.config = config
        self.metrics = Metrics()
        self.tenants = Tenants(config.api_keys)
        self.started = time.time()
        self.models = ModelPool(self, on_demand=config.on_demand, max_models=config.max_models,
                                memory_budget=config.model_memory)
        if lm is not None:
            self.models.add(config.model or lm.name, lm, backend, aliases=config.aliases)

    async def model(self, name: str) -> ServedModel:
        """The loaded model `name` names (loading it if this server serves any name); a 404
        APIError when it cannot."""
        note_model(name)
        return await self.models.get(name)

    def find_response(self, namespace: str, response_id: str):
        """(served model, stored response) of a Responses id in `namespace`, whichever loaded
        model made it; a 404 APIError when none did."""
        for served in self.models.loaded:
            try:
                return served, served.conversations.get(namespace, response_id)
            except APIError:
                continue
        raise APIError(404, f"No response {response_id!r} here (deleted, stored with store: "
                            "false, made with another API key or cache_salt, or its model was "
                            "unloaded).", "response_not_found", "response_id")


# -- small routes ---------------------------------------------------------------------------
async def health(request: Request):
    state = request.app.state.forkv
    return JSONResponse({"status": "ok", "model": state.config.model,
                         "models": [m.name for m in state.models.loaded]})


async def list_models(request: Request):
    state = request.app.state.forkv
    state.tenants.tenant(request.headers.get("authorization"))
    data = await asyncio.to_thread(state.models.listing)
    return JSONResponse({"object": "list", "data": data})


async def get_model(request: Request):
    state = request.app.state.forkv
    state.tenants.tenant(request.headers.get("authorization"))
    name = request.path_params["model"]
    served = state.models.find(name)
    if served is not None:
        return JSONResponse(model_card(state, name, served))
    if not state.config.on_demand:
        await state.model(name)  # raises the 404 that names the model served
    card = next((c for c in await asyncio.to_thread(state.models.listing) if c["id"] == name),
                None)
    if card is None:  # (a name forkv could still load, e.g. a path: a request will tell)
        raise APIError(404, f"The model {name!r} is neither loaded nor among the models found "
                            "here (GET /v1/models lists them); a request naming it tries to "
                            "load it.", "model_not_found", "model")
    return JSONResponse(card)


async def metrics(request: Request):
    state = request.app.state.forkv
    stats = await asyncio.to_thread(state.models.stats)
    return PlainTextResponse(state.metrics.render(stats),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
              "/v1/responses": "responses",
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


class _App(Starlette):
    """Starlette with `SecureHeaders` outside its error middleware, so a 500 gets them too."""

    policy: Policy

    def build_middleware_stack(self):
        return SecureHeaders(super().build_middleware_stack(), self.policy)


def make_app(state: ServerState) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await asyncio.to_thread(state.models.close)

    routes = [
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/models", list_models),
        Route("/v1/models/{model:path}", get_model),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        *WEBAPP_ROUTES,  # the web app at / and its conversation listing (webapp.py)
    ]
    app = _App(routes=routes, lifespan=lifespan)
    app.state.forkv = state
    # without an API key: /health and the web app's static files (webapp.py), so it loads
    app.policy = Policy.make(state.config.host, state.config.allow_origins,
                             public_paths=frozenset({"/health", "/"}),
                             public_prefixes=("/app/",))
    install_handlers(app)
    app.add_middleware(Guard, policy=app.policy, tenants=state.tenants)
    app.add_middleware(_CountRequests, state=state)
    app.add_middleware(AccessLog)  # outermost but SecureHeaders: it times the whole request
    return app
