"""Which replica serves a request: prefix affinity by rendezvous hashing, health, failover.

Each request carries a route key: the hash of its conversation's first block (system prompt
and first user turn), so every fork and later turn of one tree has the same key. Replicas are
ordered by rendezvous (highest random weight) hashing of (key, replica URL): the first one
holds that tree's prefix; if it fails, the next one in the same order takes over (and
recomputes the prefix there), and adding or losing a replica moves only the trees it held.
`round_robin` routing (for comparison) ignores the key. A replica that fails is marked down for
`recheck_s` seconds and tried only after the healthy ones; `check_health` probes every replica's
GET /health. Knows nothing about the chat wire format.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from dataclasses import dataclass

import httpx

__all__ = ["Replica", "Router", "health_url"]

ROUTINGS = ("affinity", "round_robin")


def health_url(base_url: str) -> str:
    """GET /health sits at the server root, beside /v1."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return root + "/health"


@dataclass(slots=True)
class Replica:
    url: str
    down_until: float = 0.0
    requests: int = 0
    failures: int = 0

    def is_up(self, now: float) -> bool:
        return self.down_until <= now


class Router:
    """Orders replicas for each request (see the module docstring)."""

    def __init__(self, urls: list[str], routing: str = "affinity", recheck_s: float = 30.0):
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}.")
        if not urls:
            raise ValueError("A remote backend needs at least one endpoint URL.")
        self.replicas = [Replica(u.rstrip("/")) for u in urls]
        self.routing, self.recheck_s = routing, recheck_s
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def order(self, key: bytes) -> list[Replica]:
        """Every replica, in the order to try them for `key`: up ones first."""
        if self.routing == "affinity":
            ranked = sorted(self.replicas, key=lambda r: _weight(key, r.url), reverse=True)
        else:
            with self._lock:
                k = next(self._turn) % len(self.replicas)
            ranked = self.replicas[k:] + self.replicas[:k]
        now = time.monotonic()
        return [r for r in ranked if r.is_up(now)] + [r for r in ranked if not r.is_up(now)]

    def mark_down(self, replica: Replica) -> None:
        with self._lock:
            replica.failures += 1
            replica.down_until = time.monotonic() + self.recheck_s

    def mark_up(self, replica: Replica) -> None:
        with self._lock:
            replica.requests += 1
            replica.down_until = 0.0

    def check_health(self, timeout: float = 2.0) -> dict[str, bool]:
        """Probe every replica's GET /health now; mark the ones that do not answer 200 down."""
        out = {}
        for r in self.replicas:
            try:
                ok = httpx.get(health_url(r.url), timeout=timeout).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                r.down_until = 0.0
            else:
                self.mark_down(r)
            out[r.url] = ok
        return out


def _weight(key: bytes, url: str) -> int:
    return int.from_bytes(hashlib.sha256(key + b"\0" + url.encode()).digest()[:8], "big")
