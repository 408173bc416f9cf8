"""The server's door to the engine: submit a request for a tenant, stream it, cancel it.

One `Backend` serves one loaded model to every tenant. Tenants are kept apart by keying: each
namespace (API-key tenant, plus a request's `cache_salt`) has its own `Engine` over the shared
model object (weights loaded once), with its own record store and namespace-salted block
keys, so one tenant's checkpoints can never serve another's prompt. Engines are made on first
use and at most `max_namespaces` are kept: past that the least recently used idle one is
closed (its checkpoints go with it). The default namespace ("") is never closed.

Requests go through the engine's one request path: `engine.submit()` returns a handle that
is iterated with `async for` and cancelled with `cancel()`. Knows nothing about HTTP.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from forkv.engine import Engine, SamplingParams

__all__ = ["Backend", "QueueFull"]

DEFAULT_MAX_NAMESPACES = 8


class QueueFull(Exception):
    """More requests in flight than the server's --max-queue."""


class Backend:
    """One model served to many tenants (see the module docstring)."""

    def __init__(self, lm, *, max_queue: int = 64, max_seqs: int = 8,
                 max_namespaces: int = DEFAULT_MAX_NAMESPACES):
        self.lm = lm
        self.max_queue, self.max_seqs, self.max_namespaces = max_queue, max_seqs, max_namespaces
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._retired = {"hits": {}, "misses": {}, "tokens_reused": 0, "tokens_computed": 0}
        self._live: set = set()  # handles not known to be done
        self._lock = threading.Lock()

    # -- namespaces ---------------------------------------------------------------------------
    def engine(self, namespace: str = "") -> Engine:
        """The engine of `namespace`, made on first use."""
        with self._lock:
            engine = self._engines.get(namespace)
            if engine is not None:
                self._engines.move_to_end(namespace)
                return engine
        engine = Engine(self.lm, namespace=namespace, max_seqs=self.max_seqs)
        with self._lock:
            if namespace in self._engines:  # another request made it meanwhile
                spare, engine = engine, self._engines[namespace]
            else:
                spare, self._engines[namespace] = None, engine
            idle = self._idle_surplus()
        for old in ([spare] if spare else []) + idle:
            old.close()
        return engine

    def _idle_surplus(self) -> list[Engine]:
        """Drop idle engines past `max_namespaces`, least recently used first (under _lock)."""
        out = []
        for ns in list(self._engines)[:-1]:
            if len(self._engines) <= self.max_namespaces:
                break
            engine = self._engines[ns]
            queue = engine.stats()["queue"]
            if ns == "" or any(queue.values()):
                continue
            del self._engines[ns]
            self._retire(engine.stats())
            out.append(engine)
        return out

    def _retire(self, st: dict) -> None:
        for name in ("hits", "misses"):
            for kind, n in st.get(name, {}).items():
                self._retired[name][kind] = self._retired[name].get(kind, 0) + n
        self._retired["tokens_reused"] += st.get("tokens_reused", 0)
        self._retired["tokens_computed"] += st.get("tokens_computed", 0)

    # -- requests -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        with self._lock:
            self._live = {h for h in self._live if not h.done}
            return len(self._live)

    def submit(self, prompt, params: SamplingParams, images=None, namespace: str = ""):
        """Queue one completion and return its handle (`async for`, `cancel()`); blocking for
        the time it takes to tokenize. `QueueFull` past `max_queue`; `GenerationError` for
        bad input."""
        if self.in_flight >= self.max_queue:
            raise QueueFull
        handle = self.engine(namespace).submit(prompt, params, images=images)
        with self._lock:
            self._live.add(handle)
        return handle

    def release(self, keys, namespace: str = "") -> int:
        """Drop the checkpoints of `keys` (hex or bytes) in `namespace`; how many records."""
        with self._lock:
            engine = self._engines.get(namespace)
        if engine is None:  # closed since: its records went with it
            return 0
        return engine.release([bytes.fromhex(k) if isinstance(k, str) else k for k in keys])

    # -- numbers ------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Totals over every namespace: reuse, hits/misses per kind, tiers, queue."""
        with self._lock:
            engines = list(self._engines.values())
            hits, misses = dict(self._retired["hits"]), dict(self._retired["misses"])
            reused, computed = self._retired["tokens_reused"], self._retired["tokens_computed"]
        tiers: dict[str, int] = {"ram": 0, "disk": 0}
        waiting = running = 0
        for engine in engines:
            st = engine.stats()
            for kind, n in st.get("hits", {}).items():
                hits[kind] = hits.get(kind, 0) + n
            for kind, n in st.get("misses", {}).items():
                misses[kind] = misses.get(kind, 0) + n
            reused += st.get("tokens_reused", 0)
            computed += st.get("tokens_computed", 0)
            for tier in ("ram", "disk"):
                tiers[tier] += st.get(tier, {}).get("bytes", 0)
            waiting += st["queue"]["waiting"]
            running += st["queue"]["prefilling"] + st["queue"]["running"]
        return {"hits": hits, "misses": misses, "tokens_reused": reused,
                "tokens_computed": computed, "tier_bytes": tiers, "waiting": waiting,
                "running": running, "in_flight": self.in_flight, "namespaces": len(engines)}

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), OrderedDict()
        for engine in engines:
            engine.close()
