"""One typed configuration for an engine, read from keywords and the `FORKV_*` environment once.

`EngineConfig` holds the engine's own knobs (block size, batch width, prefill budget, tenant
namespace, checkpoints on/off, dtype, what to do with quantized weights) and the checkpoint
tiers' `StoreSettings`. Keywords win over the environment; a bad value is one
`EngineConfigError` naming the setting (or variable) and what it takes. Knows nothing about
models or mlx.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forkv.errors import ForkvError
from forkv.security import StoreSettings
from forkv.security.settings import parse_bool, parse_size

__all__ = ["DEFAULT_RAM", "SPECULATE_MODES", "EngineConfig", "EngineConfigError", "parse_ram"]

SPECULATE_MODES = ("auto", "on", "off")
DEFAULT_RAM = 2 << 30  # why: EngineConfig.ram's description, docs/memory.md

_STORE_FIELDS = frozenset(f.name for f in fields(StoreSettings))


class EngineConfigError(ForkvError, ValueError):
    """An engine setting (keyword or `FORKV_*` variable) is invalid or unknown."""


class EngineConfig(BaseModel):
    """Every setting of an `Engine`. Build with `EngineConfig.from_env(**overrides)`; store
    settings (`ram_budget=...`, `disk=False`, ...) may be given flat among the overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    block_size: int = Field(256, gt=0, description="tokens per checkpointed block")
    max_seqs: int = Field(8, ge=1, description="requests that prefill or decode at once")
    max_prefill_tokens: int | None = Field(
        None, ge=1, description="prompt tokens one step prefills (default: one block)")
    namespace: str = Field("", description="tenant salt of the block keys")
    checkpoints: bool = True
    reuse: str = Field(
        "exact", description="exact (restore records only: bit for bit a fresh run's logits) "
        "or fast (also continue a recently finished request's cache at any token)")
    ram: int | None = Field(
        DEFAULT_RAM, description="bytes (or a size: '2GiB', '512MB') an engine may hold "
        "beyond the weights, over the running requests' caches, fast reuse's live pool, the RAM "
        "tier's records and the vision-feature cache; under pressure the pool shrinks first, "
        "then records spill to the encrypted disk tier, then requests wait (a request too big "
        "for it alone runs alone); 'off': no shared budget, each part's own cap only. Default "
        "2 GiB: a quarter of an 8 GiB laptop, room for 8 requests of 32K tokens on Gemma 3 "
        "270M (~110 MiB each at float16 K/V) beside a full pool and RAM tier (docs/memory.md)")
    live_cache_mib: int = Field(
        512, ge=0, description="cap on the RAM (inside `ram`) for the caches fast reuse "
        "continues (0: none kept)")
    speculate: str = Field(
        "auto", description="draft tokens from the request, its tree and its namespace's "
        "recent outputs and verify them (the same tokens either way): auto (where verifying "
        "is exact and pays), on (wherever it is exact), off")
    dtype: str = Field("auto", description="weights dtype: auto, float32, bfloat16, float16")
    quantized: str = Field(
        "auto", description="quantized weights: auto (dequantize on the CPU when they fit in "
        "memory), keep, dequantize")
    kv_dtype: str = Field(
        "auto", description="cached K/V where forkv's CPU kernels run attention: auto "
        "(float16), float16, bfloat16, q8_0 (8-bit, a float16 scale per 32 values), float32 "
        "(elsewhere always float32)")
    settings: StoreSettings = Field(default_factory=StoreSettings.from_env)

    @field_validator("ram", mode="before")
    @classmethod
    def _ram(cls, value: Any) -> int | None:
        return parse_ram(value)

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError("must be one of auto, float32, bfloat16, float16")
        return value

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        from .native.kvcache import KV_CHOICES

        if value not in KV_CHOICES:
            raise ValueError(f"must be one of {', '.join(KV_CHOICES)}")
        return value

    @field_validator("reuse")
    @classmethod
    def _reuse(cls, value: str) -> str:
        if value not in ("exact", "fast"):
            raise ValueError("must be exact or fast")
        return value

    @field_validator("speculate")
    @classmethod
    def _speculate(cls, value: str) -> str:
        if value not in SPECULATE_MODES:
            raise ValueError("must be one of " + ", ".join(SPECULATE_MODES))
        return value

    @field_validator("quantized")
    @classmethod
    def _quantized(cls, value: str) -> str:
        if value not in ("auto", "keep", "dequantize"):
            raise ValueError("must be one of auto, keep, dequantize")
        return value

    @property
    def prefill_budget(self) -> int:
        return self.max_prefill_tokens or self.block_size

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> EngineConfig:
        """Settings from `FORKV_<NAME>` variables of `env` (default `os.environ`, read once
        here); keywords win. Unknown keywords are an error that lists the valid ones."""
        env = os.environ if env is None else env
        own = set(cls.model_fields) - {"settings"}
        unknown = sorted(set(overrides) - own - _STORE_FIELDS - {"settings"})
        if unknown:
            valid = ", ".join(sorted(own | _STORE_FIELDS | {"settings"}))
            raise EngineConfigError(f"Unknown engine setting {unknown[0]!r}; valid: {valid}.")
        values: dict[str, Any] = {}
        for name in own:
            raw = env.get(f"FORKV_{name.upper()}", "")
            if raw != "":
                values[name] = _parse_env(name, raw)
        store = {k: overrides.pop(k) for k in list(overrides) if k in _STORE_FIELDS}
        settings = overrides.pop("settings", None)
        if settings is not None and store:
            raise EngineConfigError(
                f"Give store settings either as settings= or as keywords ({sorted(store)[0]}), "
                "not both.")
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["settings"] = settings or StoreSettings.from_env(env, **store)
        try:
            return cls(**values)
        except ValidationError as e:
            err = e.errors()[0]
            name = ".".join(str(p) for p in err["loc"])
            raise EngineConfigError(
                f"Engine setting {name}={err.get('input')!r} is invalid: {err['msg']}; "
                f"fix the keyword or FORKV_{name.upper()}.") from None


def parse_ram(value: Any) -> int | None:
    """The RAM budget in bytes from an int or a size ('2GiB', '512MB'); None for None or
    'off'. A ValueError that says what it takes otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "none")):
        return None
    try:
        n = parse_size(value, "ram")
    except ValueError:
        raise ValueError("must be a size such as '2GiB' or '512MB', or 'off'") from None
    if n <= 0:
        raise ValueError("must be more than 0 bytes ('off' for no shared budget)")
    return n


def _parse_env(name: str, raw: str) -> Any:
    var = f"FORKV_{name.upper()}"
    field = EngineConfig.model_fields[name]
    if name == "ram":
        return raw  # a size: the field parses it
    if field.annotation is bool:
        try:
            return parse_bool(raw, var)
        except ValueError as e:
            raise EngineConfigError(str(e)) from None
    if "int" in str(field.annotation):
        try:
            return int(raw)
        except ValueError:
            raise EngineConfigError(f"{var}={raw!r} is not an integer.") from None
    return raw
