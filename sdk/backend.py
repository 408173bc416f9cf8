"""The surface a `Session` (and the server) drives: the `Backend` protocol.

The local `forkv.engine.Engine` and `forkv.remote(...)` both implement it, so the same tree
runs on either. A `namespace` (a tenant) is per request: it salts that request's checkpoint
keys (and, locally, tags its records), so one backend serves many tenants that never share a
checkpoint; None is the backend's own namespace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    lm: Any  # the loaded model (tokenizer, name, fingerprint, eos_token_ids, context_length)
    block_size: int

    def submit(self, prompt, params=None, images=None, *, namespace: str | None = None,
               progress=None, **sampling: Any) -> Any:
        """Queue one completion; its handle at once (iterate it, `result()`, `cancel()`)."""

    def block_keys(self, tokens: Sequence[int], namespace: str | None = None) -> list[bytes]:
        """Keys of the full blocks of `tokens` in `namespace` (bookkeeping for release)."""

    def turn_keys(self, tokens: Sequence[int], namespace: str | None = None,
                  block_keys: Sequence[bytes] | None = None) -> dict[int, bytes]:
        """Keys of the turn-end checkpoints a run of `tokens` records, by position
        (`block_keys`: `tokens`' own, where the caller has them)."""

    def release(self, keys: Sequence[bytes]) -> int:
        """Drop the checkpoints under `keys`; how many records were dropped."""

    def stats(self) -> dict:
        """Reuse and queue numbers."""
