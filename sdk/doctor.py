"""`forkv doctor`: what this machine gives forkv — BLAS, forkv's CPU kernels (built here on
first use), device, dtype, what happens to quantized weights, versions; with a model, where its
name led and what was loaded."""

from __future__ import annotations

import os
import platform
from importlib import metadata


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def report(model: str | None = None) -> dict:
    from forkv.engine.models import blas

    info = blas.activate()
    import mlx.core as mx
    from forkv.engine import EngineConfig
    from forkv.engine.models.loader import pick_dtype

    config = EngineConfig.from_env()  # FORKV_DTYPE, FORKV_QUANTIZED, as an engine reads them

    out = {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_cores": os.cpu_count(),
        "mlx": _version("mlx"),
        "mlx-lm": _version("mlx-lm"),
        "mlx-vlm": _version("mlx-vlm"),
        "device": str(mx.default_device()),
        "blas": info.name + (f" ({info.path})" if info.path else ""),
        "blas_optimized": info.is_optimized,
        "blas_note": info.reason,
        "kernels": kernels_line(mx.default_device() == mx.cpu),
        "dtype": pick_dtype("auto", "bfloat16") + " (auto, for a bfloat16 model)",
        "quantized": _quantized_policy(config.quantized, mx.default_device() == mx.cpu),
        "speculate": f"{config.speculate} (FORKV_SPECULATE; --speculate on generate, run, "
                     "serve): drafts from the prompt, the tree and recent outputs, verified "
                     "exactly" + ("" if config.speculate != "off" else ": off"),
        "kv_dtype": _kv_line(config.kv_dtype),
        "memory": _memory_line(config),
    }
    if model:
        from forkv.engine import load_model

        lm = load_model(model, config.dtype, config.quantized, kv_dtype=config.kv_dtype)
        out.update(model=model, source=lm.source, model_type=lm.model_type,
                   model_dtype=lm.dtype, quantization=lm.quantization,
                   quant_reason=lm.quantization_reason,
                   cache_layout=lm.layout.describe(), checkpoints=lm.layout.can_checkpoint)
        from forkv.engine.request.speculate import blocker

        why = blocker(lm, config.speculate)
        out["speculate"] = (f"{config.speculate}: on for this model" if why is None else
                            f"{config.speculate}: off for this model: {why}")
        out["memory"] += _model_memory(lm, config)
        out["kv_dtype"] = (f"{lm.kv_dtype} for this model ({config.kv_dtype} asked; "
                           f"{_kv_bytes(lm)} bytes of cached K/V per token)")
    return out


def _memory_line(config) -> str:
    """What forkv may hold beyond the weights, by default or as set, and how malloc is set."""
    from forkv import arenas
    from forkv.engine.vision.features import DEFAULT_FEATURE_BYTES
    from forkv.security.settings import StoreSettings

    store = StoreSettings.from_env()
    disk = (f"encrypted disk tier up to {_mib(store.disk_budget)} (FORKV_DISK_BUDGET)"
            if store.disk and store.disk_budget else "no disk tier")
    parts = (f"fast reuse's live caches up to {_mib(config.live_cache_mib << 20)} "
             f"(FORKV_LIVE_CACHE_MIB), records in RAM up to {_mib(store.ram_budget)} "
             f"(FORKV_RAM_BUDGET), a vision model's image features up to "
             f"{_mib(DEFAULT_FEATURE_BYTES)}")
    if config.ram is None:
        budget = f"no shared RAM budget (--ram off): running requests' caches, {parts}"
    else:
        budget = (f"one RAM budget of {_mib(config.ram)} (--ram, FORKV_RAM) over running "
                  f"requests' caches, {parts}; under pressure the pool shrinks first, then "
                  "records spill to the disk tier, then requests wait")
    return (f"{budget}; {disk}; the forkv process: {arenas.ARENAS} malloc arenas, mmap "
            f"threshold {_mib(arenas.MMAP_THRESHOLD)}, freed heap trimmed when the engine "
            "idles; /metrics shows the split (forkv_ram_bytes, forkv_ram_budget_bytes, "
            "forkv_memory_bytes, forkv_tier_bytes)")


def _model_memory(lm, config) -> str:
    """What one request of this model holds, against the RAM budget."""
    from forkv.engine.cache.budget import measure_footprint

    n = min(32768, lm.context_length)
    need = measure_footprint(lm, 256).bytes_at(n)
    text = f"; {lm.name}: a request of {n:,} tokens holds ~{_mib(need)} of caches"
    if config.ram is not None:
        text += (f", the budget holds {config.ram // need:,} of them" if need <= config.ram
                 else ", more than the budget: such a request runs alone")
    return text


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 1 << 30 else f"{n / 2**30:g} GiB"


def _kv_line(asked: str) -> str:
    from forkv.engine.native import DEFAULT_KV_DTYPE

    chosen = DEFAULT_KV_DTYPE if asked == "auto" else asked
    return (f"{chosen} ({asked}; FORKV_KV_DTYPE, --kv-dtype or --kv-bits on generate, run, "
            "serve): cached K/V where forkv's CPU kernels run attention; float32 elsewhere")


def _kv_bytes(lm) -> int:
    """K/V bytes one cached token takes over every layer (a sliding layer's too)."""
    from forkv.engine.native.kvcache import bytes_per_token

    return bytes_per_token(lm.model.language_model if lm.is_vision else lm.model,
                           lm.make_cache())


def kernels_line(is_cpu: bool) -> str:
    """One line: which kernels quantized layers run on here, and why (builds them if needed)."""
    if not is_cpu:
        return "mlx's (forkv's own kernels are for the CPU device only)"
    from forkv.engine import native

    native.load()
    info = native.status()
    if info.available:
        matvec = f"; decode's matvecs: {info.matvec}" if info.matvec else ""
        return (f"forkv-native-v{native.KERNEL_VERSION} {info.isa}, {info.num_threads} threads, "
                "for quantized models' matmuls, and attention, norms, RoPE and activations "
                f"of quantized and float32 models{matvec} ({info.path})")
    return f"mlx's: forkv's CPU kernels are not in use: {info.reason}"


def _quantized_policy(mode: str, is_cpu: bool) -> str:
    from forkv.engine import native
    from forkv.engine.models.quantized import available_memory

    if mode != "auto":
        return f"{mode} (FORKV_QUANTIZED)"
    if not is_cpu:
        return "auto: keep quantized weights (this device's quantized kernels are fast)"
    if native.status().available:
        return ("auto: keep quantized weights on forkv's CPU kernels (GGUF blocks kept as "
                "they are); a model with layers they cannot run is dequantized when it fits")
    have = available_memory()
    room = f"{have / 2**30:.1f} GiB available" if have else "memory unknown"
    return ("auto: dequantize on this CPU when the float weights fit in memory "
            f"({room}); its quantized matmul is far slower than float BLAS")
