"""The root of every forkv error and warning, in one leaf module (stdlib only).

Every package (graph, engine, security, the SDK) subclasses these, so `except forkv.ForkvError`
catches anything forkv raises on purpose. Typed errors also subclass the matching builtin
(`ValueError`, `KeyError`, `PermissionError`, ...) so existing handlers keep working. Knows
nothing else: importing it imports nothing.
"""

from __future__ import annotations

__all__ = ["ForkvError", "ForkvWarning"]


class ForkvError(Exception):
    """Base of every error forkv raises; the message says what was wrong and what to do."""


class ForkvWarning(UserWarning):
    """Something degraded (a tier, batching, checkpoints) and forkv carries on without it."""
