"""Shared benchmark plumbing: machine description, repeated timings, JSON results.

Every benchmark returns a dict with the same top-level shape — benchmark, machine, model,
settings, cases, headline, targets, notes — so reports and tests read them alike.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        return 0.0


def machine_info(dtype: str | None = None) -> dict:
    from forkv.engine.models import blas

    info = blas.status()
    import mlx.core as mx

    return {
        "cpu": _cpu_name(), "cores": os.cpu_count(), "ram_gib": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "mlx": _version("mlx"), "mlx_lm": _version("mlx-lm"), "mlx_vlm": _version("mlx-vlm"),
        "device": str(mx.default_device()), "blas": info.name, "blas_optimized": info.is_optimized,
        "dtype": dtype,
    }


def summary(values: list[float]) -> dict:
    """Median and spread of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def result(benchmark: str, model: str | None, settings: dict, cases: list, headline: dict,
           targets: dict, notes: list[str] | None = None, dtype: str | None = None) -> dict:
    met = {k: _meets(headline.get(k), t) for k, t in targets.items()}
    return {"benchmark": benchmark, "machine": machine_info(dtype), "model": model,
            "settings": settings, "cases": cases, "headline": headline,
            "targets": {k: {"target": t, "met": met[k]} for k, t in targets.items()},
            "notes": notes or []}


def _meets(value, target: str) -> bool | None:
    """Targets read like '>= 20' or '<= 1.15' or '== true'."""
    if value is None:
        return None
    op, num = target.split()
    if op == "==":
        return str(value).lower() == num
    return value >= float(num) if op == ">=" else value <= float(num)


def write_json(data: dict, path: str | os.PathLike) -> None:
    """Write a benchmark's results, readable by their owner only (0600): they may quote
    prompts and answers."""
    from forkv.security import write_private_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_private_file(path, json.dumps(data, indent=2, default=str) + "\n")


def random_tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def ascii_only(lm, model: str) -> dict[int, float]:
    """A node's `logit_bias` that keeps a demo model to ASCII byte tokens ({} for real models):
    random weights emit invalid UTF-8, whose text re-encodes to other tokens, while a real
    model's text round-trips."""
    if not model.startswith("demo:"):
        return {}
    from forkv.engine.request.sampling import vocab_limit

    return {i: -1e9 for i in range(128, vocab_limit(lm) or 128)}
