"""Typed errors and the warning category of forkv.security.

Knows: what can go wrong at the API boundary (bad settings, unsafe paths, wrong keys,
corrupt persistent stores). Does not know: how faults are handled; the store turns I/O
faults into warnings (``ForkvWarning``) and misses, never into exceptions for callers.
"""

from __future__ import annotations

from forkv.errors import ForkvError, ForkvWarning

__all__ = [
    "CorruptStoreError",
    "ForkvWarning",
    "KeyFileError",
    "ModelMismatchError",
    "NonceError",
    "StoreLockedError",
    "StoreSettingsError",
    "UnsafePathError",
    "WrongKeyError",
]


class StoreSettingsError(ValueError, ForkvError):
    """A store setting (keyword or ``FORKV_*`` variable) is invalid."""


class UnsafePathError(PermissionError, ForkvError):
    """A path is a symlink, not ours, or readable by other users."""


class KeyFileError(ValueError, ForkvError):
    """A key file does not hold a 32-byte key (raw, hex or base64)."""


class WrongKeyError(ValueError, ForkvError):
    """The key or passphrase does not open this persistent store."""


class CorruptStoreError(ValueError, ForkvError):
    """A persistent store's header or index failed authentication or validation."""


class ModelMismatchError(ValueError, ForkvError):
    """A persistent store holds checkpoints of another model (weights, config or dtype)."""


class StoreLockedError(BlockingIOError, ForkvError):
    """Another process holds this persistent store open."""


class NonceError(ValueError, ForkvError):
    """A nonce is malformed (not 12 bytes) or the per-key nonce space is exhausted."""
