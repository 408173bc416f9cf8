"""`forkv doctor`: what this machine gives forkv — BLAS, device, dtype, versions."""

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
    from forkv.engine import blas

    info = blas.activate()
    import mlx.core as mx

    from forkv.engine.loader import pick_dtype

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
        "dtype": pick_dtype("auto", "bfloat16") + " (auto, for a bfloat16 model)",
    }
    if model:
        from forkv.engine import load_model

        lm = load_model(model)
        out.update(model=model, model_type=lm.model_type, model_dtype=lm.dtype,
                   cache_layout=lm.layout.describe(), checkpoints=lm.layout.can_checkpoint)
    return out
