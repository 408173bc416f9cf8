"""The models a server serves: pinned ones, and any other name loaded on the first request.

`forkv serve --model M` pins M and serves it alone (another name is a 404 naming M). Without
`--model`, or with several, the server serves any name forkv can load without a download
(folders, `.gguf` files, demo names, the named real models, LM Studio's folder, Hugging Face
snapshots already in the cache): the first request naming one loads it on a worker thread
while requests for loaded models go on, and past `max_models` (or the weights' byte budget)
the least recently used idle model that is not pinned is unloaded — its engine, checkpoints and
Responses trees go with it. A name that cannot be loaded is a 404 whose message says why.

`ServedModel` is one loaded model as the routes see it: its backend (one engine for every
tenant), conversation trees, reasoning format and names, beside the server's own config,
metrics and tenants. Knows nothing about endpoints.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict

from forkv.runner import reasoning_format

from . import logs
from .served_engine import ServedEngine
from .chat_encode import ChatEncodings
from .conversations import Conversations
from .errors import APIError

__all__ = ["ModelPool", "ServedModel", "thinks"]

DEFAULT_MAX_MODELS = 3
_log = logging.getLogger(__name__)


def thinks(tokenizer, mode: str) -> bool:
    """Whether responses generate a reasoning node first (`--reasoning`; auto: when mlx-lm
    finds thinking tags in the tokenizer)."""
    tags = getattr(tokenizer, "think_start", None) and getattr(tokenizer, "think_end", None)
    return mode == "on" or (mode == "auto" and bool(tags))


class ServedModel:
    """One loaded model and what the routes keep for it (see the module docstring)."""

    def __init__(self, server, name: str, lm, backend: ServedEngine, pinned: bool,
                 aliases: tuple[str, ...] = ()):
        self.server, self.name, self.lm, self.backend, self.pinned = (server, name, lm, backend,
                                                                      pinned)
        self.model_ids = dict.fromkeys((name, lm.name, *aliases))
        self.fingerprint = f"forkv-{lm.fingerprint.hex()[:12]}"
        self.conversations = Conversations(f"{lm.name}@{lm.fingerprint.hex()[:12]}")
        self.can_see_images = bool(getattr(lm, "is_vision", False))
        # chat prompts encoded from the namespace's last renders (text models: a vision
        # model's runner renders its own prompts)
        self.chat_encodings = None if self.can_see_images else ChatEncodings(lm.tokenizer,
                                                                               lm.name)
        # The template's thinking format, as Session detects it: it renders every path (with
        # reasoning off too); `reasoning` is it when responses think first, else None.
        self.format = reasoning_format(lm.tokenizer)
        self.reasoning = self.format if thinks(lm.tokenizer, server.config.reasoning) else None
        self.template_kwargs: dict = {}
        self.loaded_at = time.time()
        self.weight_bytes = weight_bytes(lm)  # (for the pool's memory budget; fixed once loaded)

    # The server-wide parts, so a route holds one object.
    @property
    def config(self):
        return self.server.config

    @property
    def metrics(self):
        return self.server.metrics

    @property
    def tenants(self):
        return self.server.tenants

    @property
    def started(self) -> float:
        return self.server.started

    def check_model(self, name: str) -> None:
        """(The pool already resolved the name to this model.)"""


def weight_bytes(lm) -> int:
    from mlx.utils import tree_flatten

    return sum(a.nbytes for _, a in tree_flatten(lm.model.parameters()))


class ModelPool:
    """Loaded models by every name they answer to; loads and unloads (module docstring)."""

    def __init__(self, server, *, on_demand: bool, max_models: int = DEFAULT_MAX_MODELS,
                 memory_budget: int | None = None):
        self.server = server
        self.on_demand = on_demand
        self.max_models, self.memory_budget = max_models, memory_budget
        self._models: OrderedDict[str, ServedModel] = OrderedDict()  # name -> model, LRU last
        self._loading: dict[str, asyncio.Task] = {}
        self._lock = threading.Lock()
        self.loads = self.unloads = 0

    # -- what is loaded -------------------------------------------------------------------------
    def add(self, name: str, lm, backend: ServedEngine | None = None, *, pinned: bool = True,
            aliases: tuple[str, ...] = ()) -> ServedModel:
        config = self.server.config
        backend = backend or ServedEngine(lm, max_queue=config.max_queue,
                                          max_seqs=config.max_seqs, reuse=config.reuse,
                                          speculate=config.speculate)
        served = ServedModel(self.server, name, lm, backend, pinned, aliases)
        with self._lock:
            self._models[name] = served
        return served

    @property
    def loaded(self) -> list[ServedModel]:
        with self._lock:
            return list(self._models.values())

    def find(self, name: str) -> ServedModel | None:
        with self._lock:
            for key, served in self._models.items():
                if name in served.model_ids:
                    self._models.move_to_end(key)
                    return served
        return None

    @property
    def default(self) -> ServedModel | None:
        """The first pinned model (what `forkv serve --model M` serves)."""
        return next((m for m in self.loaded if m.pinned), None)

    # -- requests -------------------------------------------------------------------------------
    async def get(self, name: str) -> ServedModel:
        """The model a request names, loading it first if the server serves any name."""
        served = self.find(name)
        if served is not None:
            return served
        if not self.on_demand:
            only = self.default
            use = f"use {next(iter(only.model_ids))!r} " if only else ""
            raise APIError(404, f"The model {name!r} is not served here; {use}(GET /v1/models "
                                "lists it).", "model_not_found", "model")
        task = self._loading.get(name)
        if task is None:
            # A task of its own: a requester that goes away does not stop a load others await.
            task = self._loading[name] = asyncio.ensure_future(self._load_and_trim(name))
            task.add_done_callback(lambda t, n=name: self._loading.pop(n, None)
                                   and (t.cancelled() or t.exception()))  # (retrieved)
        return await asyncio.shield(task)

    async def _load_and_trim(self, name: str) -> ServedModel:
        served = await asyncio.to_thread(self._load, name)
        surplus = self._surplus()
        if surplus:
            await asyncio.to_thread(self._unload, surplus)
        return served

    def _load(self, name: str) -> ServedModel:
        from forkv.engine import EngineConfig, load_model

        engine = EngineConfig.from_env()
        t0 = logs.loading(name)
        try:
            lm = load_model(name, engine.dtype, engine.quantized, download=False,
                            kv_dtype=engine.kv_dtype)
            served = self.add(name, lm, pinned=False)
        except Exception as e:  # noqa: BLE001 - any load failure is this request's 404
            logs.load_failed(name, t0, e)
            raise APIError(404, f"The model {name!r} cannot be loaded here: {e}",
                           "model_not_found", "model") from None
        self.loads += 1
        logs.ready(name, t0)
        return served

    def _surplus(self) -> list[ServedModel]:
        """Idle models to unload, least recently used first, past the count or byte budget."""
        with self._lock:
            models = list(self._models.values())
        out: list[ServedModel] = []
        count = len(models)
        total = sum(m.weight_bytes for m in models) if self.memory_budget else 0
        for m in models[:-1]:  # never the one just loaded or used
            over = count > self.max_models or (self.memory_budget and total > self.memory_budget)
            if not over:
                break
            if m.pinned or m.backend.in_flight:
                continue
            out.append(m)
            count -= 1
            total -= m.weight_bytes if self.memory_budget else 0
        return out

    def _unload(self, models: list[ServedModel]) -> None:
        for m in models:
            with self._lock:
                if self._models.get(m.name) is not m or m.backend.in_flight:
                    continue  # used again meanwhile
                del self._models[m.name]
            m.backend.close()
            self.unloads += 1
            _log.info("unloaded %s", m.name)

    # -- listing and numbers --------------------------------------------------------------------
    def listing(self) -> list[dict]:
        """Every loaded model's names, then (serving any name) what could be loaded here."""
        out, seen = [], set()
        for m in self.loaded:
            for mid in m.model_ids:
                if mid not in seen:
                    seen.add(mid)
                    out.append(model_card(self.server, mid, m))
        if self.on_demand:
            from forkv.engine.models.sources import local_models

            for name, kind in local_models():
                if name not in seen:
                    seen.add(name)
                    out.append(model_card(self.server, name, None, kind))
        return out

    def stats(self) -> dict:
        """The backends' numbers summed, with the models loaded and loads/unloads so far."""
        total = {"hits": {}, "misses": {}, "tokens_reused": 0, "tokens_computed": 0,
                 "tokens_drafted": 0, "tokens_accepted": 0, "steps_taken_back": 0,
                 "tier_bytes": {"ram": 0, "disk": 0}, "live_bytes": 0, "waiting": 0,
                 "running": 0, "in_flight": 0, "namespaces": 0, "responses_stored": 0,
                 "response_nodes": 0, "ram": {"budget": 0, "waits": 0, "parts": {}}}
        for m in self.loaded:
            responses, nodes = m.conversations.counts()
            total["responses_stored"] += responses
            total["response_nodes"] += nodes
            st = m.backend.stats()
            for name in ("hits", "misses", "tier_bytes"):
                for k, v in st[name].items():
                    total[name][k] = total[name].get(k, 0) + v
            for name in ("tokens_reused", "tokens_computed", "tokens_drafted", "tokens_accepted",
                         "steps_taken_back", "waiting", "running", "in_flight", "namespaces"):
                total[name] += st[name]
            total["live_bytes"] += st.get("live_bytes", 0)
            ram = st.get("ram")
            if ram is not None:  # (each model's engine has a budget of its own)
                total["ram"]["budget"] += ram["budget"]
                total["ram"]["waits"] += ram["waits"]
                for k, v in ram["parts"].items():
                    total["ram"]["parts"][k] = total["ram"]["parts"].get(k, 0) + v
        total.update(models_loaded=len(self.loaded), model_loads=self.loads,
                     model_unloads=self.unloads)
        return total

    def close(self) -> None:
        with self._lock:
            models, self._models = list(self._models.values()), OrderedDict()
        for m in models:
            m.backend.close()


def model_card(server, name: str, served: ServedModel | None, kind: str | None = None) -> dict:
    card = {"id": name, "object": "model", "owned_by": "forkv"}
    if served is not None:
        card.update(created=int(served.loaded_at), status="loaded",
                    context_length=served.lm.context_length,
                    kv_dtype=getattr(served.lm, "kv_dtype", None))
    else:
        card.update(created=int(server.started), status="available", source=kind)
    return card
