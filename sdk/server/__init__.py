"""forkv.server: an OpenAI-compatible HTTP server over the forkv engine (`forkv serve`).

Serves /v1/chat/completions, /v1/completions, /v1/responses (a server-side conversation tree
whose responses fork and rewind on checkpoints), /v1/models, /health and /metrics, with a log
on stderr (`logs`). Importing this package imports nothing heavy: Starlette loads with
`make_app`, mlx when the model loads.
"""

from __future__ import annotations

import importlib

__all__ = ["ServerConfig", "ServerState", "make_app", "run_serve", "serve"]

_HOME = {"ServerConfig": "app", "ServerState": "app", "make_app": "app", "run_serve": "serve",
         "serve": "serve"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
