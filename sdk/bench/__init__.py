"""forkv benchmarks: `forkv bench NAME` runs one, `forkv bench all` runs the suite.

Each benchmark is a function returning a JSON-ready dict (see `common.result`); ours and the
baseline always run in the same command, interleaved, so a drifting machine does not bias
the ratio. Modules are imported lazily: a benchmark costs nothing until it runs.
"""

from __future__ import annotations

import importlib

# name -> (module, function, default models)
BENCHMARKS = {
    "rewind": ("rewind", "run_rewind_bench", ("demo:gemma3:small", "demo:qwen3_5:small")),
    "agent": ("agent", "run_agent_bench", ("demo:gemma3:small", "demo:qwen3_5:small")),
    "parallel": ("parallel", "run_parallel_bench", ("demo:gemma3:small",)),
    "memory": ("memory", "run_memory_bench", ("demo:gemma3:small", "demo:qwen3_5:small")),
    "image": ("image", "run_image_bench", ("demo:qwen2_vl:small", "demo:qwen3_5_vl:small",
                                           "demo:gemma3_vl:small", "demo:gemma4_vl:small")),
    "store": ("store", "run_store_bench", ("demo:gemma3:small",)),
    "blas": ("blas", "run_blas_bench", ("demo:gemma3:small",)),
    "constrained": ("constrained", "run_constrained_bench", ("demo:gemma3:small",)),
    "serve": ("serve", "run_serve_bench",
              ("demo:gemma3:small", "demo:qwen3_5:small", "demo:qwen3:small")),
    "cluster": ("cluster", "run_cluster_bench", ("demo:qwen3:tiny",)),
    "weights": ("weights", "run_weights_bench", ("gemma3-270m",)),
    "restore": ("restore", "run_restore_bench", ("demo:gemma3:small",)),
    "contention": ("contention", "run_contention_bench", ("demo:gemma3:small",)),
    "depth": ("depth", "run_depth_bench", ("demo:qwen3:tiny",)),
    "decode": ("decode", "run_decode_bench", ("smollm2-135m", "gemma3-270m")),
    "kv": ("kv_dtype", "run_kv_bench", ("gemma3-270m", "smollm2-135m")),
}

# Benchmarks whose default is a named real model when its package is installed (the `gemma`
# extra); --quick, or a machine without it, keeps the demo models above.
_REAL_DEFAULTS = {"serve": "gemma3-270m", "restore": "gemma3-270m", "contention": "gemma3-270m"}
# Benchmarks whose defaults are named real models: --quick runs this demo model instead.
_QUICK_MODELS = {"decode": "demo:gemma3:tiny", "kv": "demo:gemma3:tiny"}

__all__ = ["BENCHMARKS", "available", "run_benchmark"]


def _function(name: str):
    module, func, _ = BENCHMARKS[name]
    try:
        mod = importlib.import_module(f"forkv.bench.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"forkv.bench.{module}":
            return None
        raise
    return getattr(mod, func)


def available() -> list[str]:
    return [name for name in BENCHMARKS if _function(name) is not None]


def run_benchmark(name: str, models: list[str] | None = None, quick: bool = False,
                  reps: int | None = None, settings: list[str] | None = None) -> dict:
    """Run one benchmark on each model; one model gives its result, several a 'runs' list
    whose headline is the least favourable figure of each. `settings` are NAME=VALUE strings
    for the benchmark's own keyword arguments (sizes, modes)."""
    from .options import parse_settings

    fn = _function(name)
    if fn is None:
        raise ValueError(f"Benchmark {name!r} is not available in this build; choose one of "
                         f"{', '.join(available())}.")
    kwargs = {"quick": quick, **parse_settings(fn, settings or [])}
    if reps is not None:
        kwargs["reps"] = reps
    if not models:
        models = list(BENCHMARKS[name][2])
        if name in _REAL_DEFAULTS and not quick and _has_named(_REAL_DEFAULTS[name]):
            models = [_REAL_DEFAULTS[name]]
        elif quick:  # smoke tests: the tiny variant of the first default model
            models = [_QUICK_MODELS.get(name) or models[0].replace(":small", ":tiny")]
    runs = [fn(model=m, **kwargs) for m in models]
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[0], model=[r["model"] for r in runs], runs=runs)
    merged["headline"] = _worst(runs)
    return merged


def _has_named(model: str) -> bool:
    from forkv.engine.models.named import NAMED_MODELS

    return NAMED_MODELS[model].is_local()


def _worst(runs: list[dict]) -> dict:
    """Per headline figure, the run that meets its target least well (ratios: the smallest,
    overheads: the largest, booleans: all must hold)."""
    out = {}
    for key in runs[0]["headline"]:
        values = [r["headline"].get(key) for r in runs]
        if all(isinstance(v, bool) for v in values):
            out[key] = all(values)
        elif all(isinstance(v, (int, float)) for v in values):
            target = runs[0]["targets"].get(key, {}).get("target", ">=")
            out[key] = max(values) if target.startswith("<=") else min(values)
        else:
            out[key] = values
    return out
