"""Settings of the checkpoint tiers: one frozen object, filled from keywords and FORKV_* env.

Knows: every knob of the RAM and disk tiers, how to parse sizes ('512MB', '1GiB', '0') and
switches ('on'/'off'), and which combinations make sense. Does not know: the RAM tier itself
(the engine's record store reads ``ram_budget``); the disk tier is ``BlobStore``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import StoreSettingsError
from .keys import Secret

__all__ = ["MAX_SCRYPT_N", "MIN_SCRYPT_N", "StoreSettings", "parse_bool", "parse_size"]

_ENV_PREFIX = "FORKV_"
# A raw key never comes from the environment: env leaks into child processes and /proc.
_NO_ENV = frozenset({"key"})
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
# scrypt cost bounds (r = 8, p = 1): 2^15 is 32 MiB and ~0.1 s per guess, 2^20 is 1 GiB. The
# persistent header is checked against the same bounds before any key derivation.
MIN_SCRYPT_N = 1 << 15
MAX_SCRYPT_N = 1 << 20
_PASSPHRASE_VAR = "FORKV_PASSPHRASE"
_env_passphrase: Secret | None = None  # FORKV_PASSPHRASE, once moved out of the environment
_TRUE = frozenset({"1", "on", "true", "yes"})
_FALSE = frozenset({"0", "off", "false", "no"})


def parse_size(value: int | str, name: str = "size") -> int:
    """Bytes from an int or a string: '0', '4096', '512MB' (10**6), '512M'/'512MiB' (2**20)."""
    if isinstance(value, bool):
        raise StoreSettingsError(f"{name} must be a byte count, not {value!r}.")
    if isinstance(value, int):
        if value < 0:
            raise StoreSettingsError(f"{name} must be >= 0 bytes, got {value}.")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise StoreSettingsError(f"{name}={value!r} is not a size; write e.g. '512MB' or '1GiB'.")
    number, unit, binary, suffix_b = match.groups()
    scale = _UNITS[unit.lower()]
    if unit and suffix_b and not binary:
        scale = 1000 ** "bkmgt".index(unit.lower())  # 'MB' is decimal, 'MiB' and 'M' binary
    return int(float(number) * scale)


def parse_bool(value: bool | str, name: str = "switch") -> bool:
    """A switch from a bool or 'on'/'off', 'true'/'false', 'yes'/'no', '1'/'0'."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StoreSettingsError(f"{name}={value!r} is not a switch; use 'on' or 'off'.")


def _parse_int(value: int | str, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise StoreSettingsError(f"{name}={value!r} is not an integer.") from None


_ENV_PARSERS = {
    "ram_budget": parse_size,
    "tenant_ram_budget": parse_size,
    "disk_budget": parse_size,
    "queue_bytes": parse_size,
    "scrypt_n": _parse_int,
    "queue_max": _parse_int,
    "disk": parse_bool,
    "handle_signals": parse_bool,
}


@dataclass(slots=True, frozen=True)
class StoreSettings:
    """Every setting of the checkpoint tiers. Build with ``StoreSettings.from_env(**overrides)``.

    ``ram_budget``/``disk_budget`` are bytes; ``disk=False`` (``FORKV_DISK=off``) or a zero disk
    budget turns the disk tier off. Setting ``persist_path`` switches from the default
    ephemeral store (random in-memory key, private temp folder) to a persistent one that needs
    exactly one of ``key_file``, ``passphrase`` or ``key``.
    """

    # Small on purpose: a record restored from the disk tier costs about one decode step, and
    # the OS page cache keeps the (sealed) data file in RAM while memory is free and gives it
    # back when it is not; pinned RAM-tier records cannot be given back.
    ram_budget: int = 64 << 20
    # 0: tenants share `ram_budget`; else the most of it one namespace's records may hold (its
    # least recently used ones move on to the disk tier past it, as evictions do)
    tenant_ram_budget: int = 0
    disk_budget: int = 4 << 30
    disk: bool = True
    disk_dir: str | None = None  # parent of the private folder; default: the system temp dir
    persist_path: str | None = None
    key_file: str | None = None
    passphrase: Secret | None = field(default=None, repr=False)
    key: Secret | None = field(default=None, repr=False)
    scrypt_n: int = 1 << 17  # scrypt cost for passphrases; stored in the file header
    queue_max: int = 4096  # records waiting for the background writer (bytes bound it first)
    queue_bytes: int = 128 << 20  # bytes waiting for the background writer (full: drop, count)
    handle_signals: bool = True  # clean up on SIGTERM/SIGHUP when they are at their defaults

    def __post_init__(self) -> None:
        # Normalise loose inputs once so the rest of the package sees one shape.
        put = object.__setattr__
        for name in ("ram_budget", "tenant_ram_budget", "disk_budget", "queue_bytes"):
            put(self, name, parse_size(getattr(self, name), name))
        for name in ("scrypt_n", "queue_max"):
            put(self, name, _parse_int(getattr(self, name), name))
        for name in ("disk", "handle_signals"):
            put(self, name, parse_bool(getattr(self, name), name))
        for name in ("disk_dir", "persist_path", "key_file"):
            value = getattr(self, name)
            put(self, name, os.fspath(value) if value not in (None, "") else None)
        for name in ("passphrase", "key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Secret):
                put(self, name, Secret(value))
        self._validate()

    def _validate(self) -> None:
        if self.queue_max < 1:
            raise StoreSettingsError(f"queue_max must be >= 1, got {self.queue_max}.")
        n = self.scrypt_n
        if not MIN_SCRYPT_N <= n <= MAX_SCRYPT_N or n & (n - 1):
            raise StoreSettingsError(
                f"scrypt_n must be a power of two from {MIN_SCRYPT_N} to {MAX_SCRYPT_N}, got {n}."
            )
        sources = [s for s in ("key_file", "passphrase", "key") if getattr(self, s) is not None]
        if self.persist_path is None and sources:
            raise StoreSettingsError(
                f"{sources[0]} is set but persist_path is not; set FORKV_PERSIST_PATH too, "
                "or drop the key to use the ephemeral store."
            )
        if self.persist_path is not None and len(sources) != 1:
            raise StoreSettingsError(
                "A persistent store needs exactly one of key_file, passphrase or key "
                f"(got {', '.join(sources) or 'none'})."
            )
        if self.key is not None and len(self.key) != 32:
            raise StoreSettingsError("key must be exactly 32 bytes (AES-256).")
        if self.passphrase is not None and len(self.passphrase) == 0:
            raise StoreSettingsError("passphrase must not be empty.")

    @property
    def mode(self) -> str:
        """'off', 'ephemeral' or 'persistent'."""
        if not self.disk or self.disk_budget == 0:
            return "off"
        return "persistent" if self.persist_path else "ephemeral"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> StoreSettings:
        """Settings from ``FORKV_*`` variables of ``env`` (default ``os.environ``); keywords win.

        Variables are ``FORKV_`` + the field name in capitals (``FORKV_RAM_BUDGET=512MB``,
        ``FORKV_DISK=off``, ``FORKV_PERSIST_PATH``, ``FORKV_KEY_FILE``, ``FORKV_PASSPHRASE``...).
        An empty variable counts as unset. ``FORKV_PASSPHRASE`` is moved out of ``os.environ``
        into process memory on first read, so child processes never inherit it; later calls in
        this process still see it.
        """
        from_process = env is None or env is os.environ
        if from_process:
            take_passphrase_from_env()
        env = os.environ if env is None else env
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(
                f"Unknown store setting {unknown[0]!r}; valid: {', '.join(sorted(names))}."
            )
        values: dict[str, Any] = {}
        for name in names - _NO_ENV:
            var = _ENV_PREFIX + name.upper()
            raw = env.get(var, "")
            if raw != "":
                # Parse here so a bad value names the variable, not the field.
                values[name] = _ENV_PARSERS.get(name, lambda v, _n: v)(raw, var)
        if from_process and _env_passphrase is not None:
            values["passphrase"] = _env_passphrase
        values.update(overrides)
        return cls(**values)


def take_passphrase_from_env() -> None:
    """Move ``FORKV_PASSPHRASE`` from the environment into process memory (idempotent).

    Its bytes are overwritten in place first (the environment block is what
    ``/proc/<pid>/environ`` shows), then it is unset, so child processes never inherit it.
    """
    global _env_passphrase
    if _PASSPHRASE_VAR not in os.environ:
        return
    _zero_c_value(_PASSPHRASE_VAR)
    raw = os.environ.pop(_PASSPHRASE_VAR)
    if raw != "":
        _env_passphrase = Secret(raw)
    del raw


def _zero_c_value(name: str) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        address = libc.getenv(name.encode())
        if address:
            ctypes.memset(address, 0, len(ctypes.string_at(address)))
    except (OSError, AttributeError):
        pass  # no C library to reach: unsetting below still keeps it from children
