"""The server's door to one model's engine: submit a request for a tenant, stream it, cancel it.

One `ServedEngine` serves one loaded model to every tenant through one `Engine`: one engine thread,
one scheduler and one record store. A tenant is a namespace (API-key tenant, salted by a
request's `cache_salt`) carried on each request: it salts that request's block and turn-end
keys and tags its records, so rows of different tenants decode in one batch, eviction is one
byte budget across tenants, and one tenant's checkpoints can never serve another's prompt
(keys differ, and a record whose tag is not the request's is a miss even under a colliding
key). Inside one namespace time to first token still tells whether a prefix was cached: that
is what a namespace shares.

Requests go through the engine's one request path: `submit()` returns a handle that is
iterated with `async for` and cancelled with `cancel()`. Knows nothing about HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from forkv.engine import Engine, SamplingParams

__all__ = ["QueueFull", "ServedEngine"]

_NAMESPACES_SEEN = 4096  # distinct recent namespaces counted for the metrics


class QueueFull(Exception):
    """More requests in flight than the server's --max-queue."""


class ServedEngine:
    """One model served to many tenants (see the module docstring). Not the SDK's
    `forkv.backend.Backend` protocol: this one takes a tenant namespace and counts tenants."""

    def __init__(self, lm, *, max_queue: int = 64, max_seqs: int = 8,
                 engine: Engine | None = None, reuse: str | None = None,
                 speculate: str | None = None):
        self.lm = lm
        self.max_queue, self.max_seqs = max_queue, max_seqs
        self.engine = engine or Engine(lm, max_seqs=max_seqs, reuse=reuse, speculate=speculate)
        self._live: set = set()  # handles not known to be done
        self._seen: OrderedDict[str, float] = OrderedDict()  # namespace -> last request
        self._lock = threading.Lock()

    # -- requests -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        with self._lock:
            self._live = {h for h in self._live if not h.done}
            return len(self._live)

    def submit(self, prompt, params: SamplingParams, images=None, namespace: str = "",
               speculate: str | None = None, drafts=()):
        """Queue one completion for `namespace` and return its handle (`async for`,
        `cancel()`); blocking for the time it takes to tokenize. `QueueFull` past
        `max_queue`; `GenerationError` for bad input."""
        if self.in_flight >= self.max_queue:
            raise QueueFull
        handle = self.engine.submit(prompt, params, images=images, namespace=namespace,
                                    speculate=speculate, drafts=drafts)
        with self._lock:
            self._live.add(handle)
            self._seen[namespace] = time.monotonic()
            self._seen.move_to_end(namespace)
            while len(self._seen) > _NAMESPACES_SEEN:
                self._seen.popitem(last=False)
        return handle

    def release(self, keys, namespace: str = "") -> int:
        """Drop the checkpoints of `keys` (hex or bytes; keys of `namespace`, which only its
        requests make); how many records."""
        return self.engine.release([bytes.fromhex(k) if isinstance(k, str) else k for k in keys])

    # -- numbers ------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Reuse, hits/misses per kind, tier bytes, queue, and the namespaces seen."""
        st = self.engine.stats()
        with self._lock:
            namespaces = len(self._seen)
        return {"hits": dict(st.get("hits", {})), "misses": dict(st.get("misses", {})),
                "tokens_reused": st.get("tokens_reused", 0),
                "tokens_computed": st.get("tokens_computed", 0),
                "tokens_drafted": st["steps"]["drafted_tokens"],
                "tokens_accepted": st["steps"]["accepted_tokens"],
                "steps_taken_back": st["steps"]["taken_back"],
                "tier_bytes": {t: st.get(t, {}).get("bytes", 0) for t in ("ram", "disk")},
                "live_bytes": st.get("live", {}).get("bytes", 0),
                "ram": _ram_split(st["ram_budget"]),
                "waiting": st["queue"]["waiting"],
                "running": st["queue"]["prefilling"] + st["queue"]["running"],
                "in_flight": self.in_flight, "namespaces": namespaces}

    def close(self) -> None:
        self.engine.close()


def _ram_split(ram: dict) -> dict:
    """The RAM budget (0: none) and what each part holds against it (engine/cache/budget.py)."""
    return {"budget": ram["budget"] or 0, "waits": ram["waits"],
            "parts": {k: ram[k] for k in ("running", "pool", "records", "features")}}
