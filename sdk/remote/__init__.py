"""forkv.remote: run conversation trees on remote OpenAI-compatible servers.

`forkv.remote("http://host:8000/v1", model=..., api_key=...)` (or a list of endpoints) gives a
backend with the engine surface `Session` uses (`submit`, `block_keys`, `release`, `stats`),
so `forkv.Session(forkv.remote(...))` runs the same trees on `forkv serve`, vLLM, SGLang or
`mlx_lm.server` replicas, routed by prefix affinity with failover. See docs/scale-out.md.
"""

from __future__ import annotations

from typing import Any

from .backend import NoReplicaLeft, RemoteBackend, RemoteError
from .model import RemoteModel, TokenizerNotFound
from .router import Router

__all__ = ["NoReplicaLeft", "RemoteBackend", "RemoteError", "RemoteModel", "Router",
           "TokenizerNotFound", "remote"]


def remote(endpoints: str | list[str], model: str | None = None, *, api_key: str | None = None,
           tokenizer: Any = None, routing: str = "affinity", **options: Any) -> RemoteBackend:
    """A backend over OpenAI-compatible `endpoints` (base URLs ending in /v1).

    `model` is the served model's name (default: the first one GET /v1/models lists);
    `tokenizer` a local folder or `demo:` name with its tokenizer (default: `model` when it is
    one); `routing` "affinity" (rendezvous hashing of each tree's first block) or
    "round_robin". Other options: `cache_salt` (default: one per `api_key`), `block_size` (the
    server's cache block, for recorded keys), `reasoning` (a `forkv.graph.ReasoningFormat`),
    `context_length`, `timeout_s`, `connect_timeout_s`, `max_attempts`, `recheck_s`.
    """
    return RemoteBackend(endpoints, model, api_key=api_key, tokenizer=tokenizer,
                         routing=routing, **options)
