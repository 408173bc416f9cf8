"""`forkv bench weights`: prefill and decode speed per weight format, forkv beside mlx-lm.

One model, four variants, each loaded on its own (the others dropped first, so memory stays
that of one variant on each side):

- float32 and bfloat16: the model's folder, cast to that dtype;
- q4_kept: a 4-bit MLX folder made once from the model by mlx-lm's own converter
  (`mlx_lm.convert`, affine, group 64, bfloat16 scales as published MLX folders have them;
  cached under `<forkv cache>/bench/`), its quantized layers kept, float32 activations;
- q4_dequantized: that folder dequantized at load to float32 (`quantized="dequantize"`, what
  forkv's `auto` does on the CPU).

Per variant, rep by rep and interleaved: forkv (`Engine`, checkpoints off, so every prompt
token is computed: checked from the event timings) and plain mlx-lm (`stream_generate`) on its
own copy of the same weights loaded the same way (the dequantized variant: mlx-lm's
`dequantize_model`, then float32). Both sides prefill the same random prompt and decode
exactly `gen_tokens` (EOS off on both). Both are timed alike: prefill tok/s = prompt tokens /
time to the first token; decode tok/s = (generated - 1) / time from the first to the last.
Knows nothing about how forkv decides what to do with quantized weights: it asks for each.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .common import random_tokens, result, summary

VARIANTS = ("float32", "bfloat16", "q4_kept", "q4_dequantized")
DEFAULT_MODEL = "gemma3-270m"
_Q_GROUP = 64


@dataclass(slots=True, frozen=True)
class _Variant:
    name: str
    dtype: str
    is_q4: bool  # loads the 4-bit folder
    quantized: str | None  # forkv's load_model keyword; None: the folder is not quantized

    @property
    def dequantize(self) -> bool:  # the 4-bit folder, dequantized at load
        return self.is_q4 and self.quantized == "dequantize"


# The float variants load the float folder: "dequantize", since `auto` would load a GGUF's
# quantized blocks onto forkv's kernels (a float folder loads as it is either way).
_SPECS = {
    "float32": _Variant("float32", "float32", False, "dequantize"),
    "bfloat16": _Variant("bfloat16", "bfloat16", False, "dequantize"),
    "q4_kept": _Variant("q4_kept", "float32", True, "keep"),
    "q4_dequantized": _Variant("q4_dequantized", "float32", True, "dequantize"),
}


# -- loading ---------------------------------------------------------------------------------------
def _has_quantized_keyword() -> bool:
    from forkv.engine import load_model

    return "quantized" in inspect.signature(load_model).parameters


def _num_quantized(model) -> int:
    return sum(1 for _, m in model.named_modules() if "scales" in m and hasattr(m, "bits"))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _load_ours(name: str, v: _Variant):
    """forkv's LoadedModel and Engine (checkpoints off, EOS off), and what loading cost."""
    import mlx.core as mx

    from forkv.engine import Engine, load_model

    before = mx.get_active_memory()
    t0 = time.perf_counter()
    kwargs = {"quantized": v.quantized} if v.quantized and _has_quantized_keyword() else {}
    lm = load_model(name, dtype=v.dtype, **kwargs)
    engine = Engine(lm, checkpoints=False)
    load_s = time.perf_counter() - t0
    lm.eos_token_ids = frozenset()  # every run decodes exactly gen_tokens
    return engine, {"load_s": round(load_s, 2), "dtype": lm.dtype,
                    "weights_mib": round((mx.get_active_memory() - before) / 2**20, 1),
                    "quantized_layers": _num_quantized(lm.model),
                    "quantization": getattr(lm, "quantization", "?"), "rss_mib": _rss_mib()}


def _load_peer(folder: Path, v: _Variant):
    """Plain mlx-lm on the same folder, given the same dtype and quantization choice."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model, load

    before = mx.get_active_memory()
    t0 = time.perf_counter()
    model, tokenizer = load(str(folder))
    if v.dequantize:
        dequantize_model(model)
    target = getattr(mx, v.dtype)
    floats = [p.dtype for _, p in tree_flatten(model.parameters())
              if mx.issubdtype(p.dtype, mx.floating)]
    if any(d != target for d in floats):
        model.set_dtype(target)
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    tokenizer.eos_token_ids = set()  # our own copy: every run decodes exactly gen_tokens
    return (model, tokenizer), {"load_s": round(load_s, 2), "dtype": v.dtype,
                                "weights_mib": round((mx.get_active_memory() - before) / 2**20, 1),
                                "quantized_layers": _num_quantized(model), "rss_mib": _rss_mib()}


def _q4_folder(src: Path, fingerprint: bytes, bits: int) -> tuple[Path, bool]:
    """The 4-bit MLX folder of `src` (made by mlx_lm.convert on first use, then reused: its
    name carries the source's fingerprint and mlx-lm's version); True if made just now."""
    from forkv.engine.paths import cache_root

    from .common import _version

    key = fingerprint + f"|{bits}|{_Q_GROUP}|bfloat16|{_version('mlx-lm')}".encode()
    folder = cache_root() / "bench" / f"q{bits}-{hashlib.sha256(key).hexdigest()[:16]}"
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder, False
    from mlx_lm.convert import convert

    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a private model's too
    tmp = Path(tempfile.mkdtemp(prefix=".q4-", dir=folder.parent))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its [INFO] lines; stdout may be JSON
            convert(str(src), str(tmp / "out"), quantize=True, q_bits=bits,
                    q_group_size=_Q_GROUP, dtype="bfloat16")
        shutil.rmtree(folder, ignore_errors=True)  # a half-written one from a crash
        os.replace(tmp / "out", folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, True


def _free() -> None:
    """Give back what a dropped variant held (its callers hold no reference any more)."""
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _check_layers(v: _Variant, side: str, load: dict) -> None:
    kept = v.is_q4 and not v.dequantize
    if (load["quantized_layers"] > 0) != kept:
        raise RuntimeError(f"{side} loaded {v.name} with {load['quantized_layers']} quantized "
                           f"layers, expected {'some' if kept else 'none'}: this run would "
                           "measure another format.")


# -- measuring -------------------------------------------------------------------------------------
def _run_ours(engine, prompt: list[int], gen: int) -> dict:
    t = engine.generate(prompt, max_tokens=gen).timings
    if t.computed_tokens != len(prompt) or t.reused_tokens or t.generated_tokens != gen:
        raise RuntimeError(f"forkv computed {t.computed_tokens} of {len(prompt)} prompt tokens "
                           f"(reused {t.reused_tokens}) and generated {t.generated_tokens} of "
                           f"{gen}: this run measured something else.")
    decode = (gen - 1) / t.decode_s if gen > 1 and t.decode_s else None
    return {"prefill_tps": len(prompt) / t.first_token_s, "decode_tps": decode,
            "engine_prefill_tps": t.prefill_tps, "computed_tokens": t.computed_tokens}


def _run_peer(peer, prompt: list[int], gen: int) -> dict:
    from mlx_lm.generate import stream_generate

    model, tokenizer = peer
    t0 = time.perf_counter()
    first = last = resp = None
    for resp in stream_generate(model, tokenizer, prompt, max_tokens=gen):
        last = time.perf_counter()
        first = first or last
    if resp is None or resp.generation_tokens != gen or resp.prompt_tokens != len(prompt):
        raise RuntimeError(f"mlx-lm generated {resp and resp.generation_tokens} of {gen} "
                           "tokens: this run measured something else.")
    decode = (gen - 1) / (last - first) if gen > 1 and last > first else None
    return {"prefill_tps": len(prompt) / (first - t0), "decode_tps": decode,
            "own_prompt_tps": resp.prompt_tps, "own_generation_tps": resp.generation_tps}


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return round(summary(values)["median"], 2) if values else None


def _measure(name: str, folder: Path, v: _Variant, prompts: list[list[int]],
             gen: int) -> dict:
    import mlx.core as mx

    engine, ours_load = _load_ours(name, v)
    try:
        peer, peer_load = _load_peer(folder, v)
        _check_layers(v, "forkv", ours_load)
        _check_layers(v, "mlx-lm", peer_load)
        warm = prompts[0][:32]
        _run_ours(engine, warm, 2)  # first-call costs hit neither measurement
        _run_peer(peer, warm, 2)
        ours, base = [], []
        for prompt in prompts:  # one rep each, interleaved
            ours.append(_run_ours(engine, prompt, gen))
            base.append(_run_peer(peer, prompt, gen))
            mx.clear_cache()
    finally:
        engine.close()
    case = {"variant": v.name, "folder": str(folder), "quantized": v.quantized,
            "forkv": {**ours_load, "runs": ours}, "mlx_lm": {**peer_load, "runs": base}}
    for side, runs in (("forkv", ours), ("mlx_lm", base)):
        for key in ("prefill_tps", "decode_tps"):
            values = [r[key] for r in runs if r[key] is not None]
            case[side][key] = summary(values) if values else None
            case[side][f"{key}_median"] = _median(runs, key)
    return case


# -- the benchmark ---------------------------------------------------------------------------------
def _resolve(model: str, quick: bool) -> tuple[str, list[str]]:
    """The model to run: the default real model when it loads here, else the demo model.
    `--quick` (smoke tests, `bench all --quick`) runs the tiny demo in the default's place:
    four variants of a real model take minutes even at quick sizes."""
    if model != DEFAULT_MODEL:
        return model, []
    if quick:
        return "demo:gemma3:tiny", [f"--quick ran demo:gemma3:tiny in place of {model}; for "
                                    f"{model} at small sizes, --set prompt_tokens=64 ..."]
    from forkv.engine import ModelLoadError
    from forkv.engine.models.sources import resolve_source

    try:
        resolve_source(model, download=False)
        return model, []
    except ModelLoadError as e:
        return "demo:gemma3:small", [f"{model} is not loadable here ({e}); ran "
                                     "demo:gemma3:small instead"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def run_weights_bench(model: str = DEFAULT_MODEL, quick: bool = False, reps: int = 3,
                      prompt_tokens: int = 1024, gen_tokens: int = 64,
                      variants: tuple[str, ...] = VARIANTS, q_bits: int = 4) -> dict:
    """Prefill and decode tok/s of each weight variant in forkv and in mlx-lm, medians over
    `reps` interleaved runs; `variants` picks some of float32, bfloat16, q4_kept,
    q4_dequantized."""
    from forkv.engine.models import blas

    blas.activate()  # before mlx is imported, for forkv and mlx-lm alike
    unknown = [v for v in variants if v not in _SPECS]
    if unknown:
        raise ValueError(f"Unknown variant {', '.join(unknown)}; choose from "
                         f"{', '.join(VARIANTS)}.")
    if quick:
        reps, prompt_tokens, gen_tokens = 1, 64, 8
    model, notes = _resolve(model, quick)
    load_before = [round(x, 2) for x in os.getloadavg()]  # is the machine quiet? (1/5/15 min)
    from forkv.engine.models.fingerprint import fingerprint
    from forkv.engine.models.loader import read_config
    from forkv.engine.models.sources import resolve_source

    t0 = time.perf_counter()
    src = resolve_source(model).path
    config = read_config(src)
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 256)
    q4, made = None, False
    if any(_SPECS[v].is_q4 for v in variants):  # keyed on every byte of the source's weights
        q4, made = _q4_folder(src, fingerprint(src, config, "float32"), q_bits)
    quantize_s = round(time.perf_counter() - t0, 2)
    prompts = [random_tokens(prompt_tokens, seed=r, vocab=min(vocab, 4096)) for r in range(reps)]
    cases, skipped = [], []
    for name in variants:
        v = _SPECS[name]
        if v.dequantize and not _has_quantized_keyword():
            skipped.append(name)
            notes.append(f"{name} skipped: this forkv's load_model has no quantized= keyword")
            continue
        folder = q4 if v.is_q4 else src
        cases.append(_measure(str(folder) if v.is_q4 else model, folder, v, prompts,
                              gen_tokens))
        _free()  # the variant's models went with _measure's frame
    by = {c["variant"]: c for c in cases}

    def fig(variant: str, side: str, key: str) -> float | None:
        return by[variant][side][f"{key}_median"] if variant in by else None

    headline = {
        "dequantized_vs_float32_prefill": _ratio(fig("q4_dequantized", "forkv", "prefill_tps"),
                                                 fig("float32", "forkv", "prefill_tps")),
        "dequantized_vs_float32_decode": _ratio(fig("q4_dequantized", "forkv", "decode_tps"),
                                                fig("float32", "forkv", "decode_tps")),
        "dequantized_vs_kept_prefill": _ratio(fig("q4_dequantized", "forkv", "prefill_tps"),
                                              fig("q4_kept", "forkv", "prefill_tps")),
        "dequantized_vs_kept_decode": _ratio(fig("q4_dequantized", "forkv", "decode_tps"),
                                             fig("q4_kept", "forkv", "decode_tps")),
    }
    for name in VARIANTS:  # every figure, None where not measured: one shape for reports
        for key in ("prefill_tps", "decode_tps"):
            ours, base = fig(name, "forkv", key), fig(name, "mlx_lm", key)
            headline[f"{name}_{key}"] = ours
            headline[f"mlx_lm_{name}_{key}"] = base
            headline[f"{name}_{key.removesuffix('_tps')}_vs_mlx_lm"] = _ratio(ours, base)
    notes += [
        "forkv: Engine with checkpoints off (every prompt token computed, checked per run); "
        "mlx-lm: stream_generate on its own copy of the weights; EOS off on both sides",
        "prefill tok/s = prompt tokens / time to the first token; decode tok/s = (generated - "
        "1) / first to last token; medians over reps, forkv and mlx-lm interleaved; forkv "
        "prefills in block-aligned chunks, mlx-lm in its own (prefill_step_size 2048)",
        f"forkv's BLAS shim ({blas.status().name}) is loaded before mlx, so mlx-lm in this "
        "process uses it too: the float32 matmuls of both sides run on the same BLAS",
        f"4-bit folder: mlx_lm.convert (q_bits={q_bits}, group {_Q_GROUP}, bfloat16 scales) "
        f"of {src}, {'made in this run' if made else 'reused'} at {q4}" if q4 else
        "no 4-bit variant asked for",
        "load_s: forkv load_model + Engine; mlx-lm load (+ dequantize_model, set_dtype, eval); "
        "weights_mib: mlx active memory the load added; rss_mib: process RSS after it",
    ]
    settings = {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "reps": reps,
                "variants": list(variants), "skipped": skipped, "q_bits": q_bits,
                "q_group_size": _Q_GROUP, "source_folder": str(src),
                "q4_folder": str(q4) if q4 else None, "q4_prepare_s": quantize_s,
                "blas_threads": blas.status().num_threads, "load_average_before": load_before,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                      1)}
    return result("weights", model, settings, cases, headline,
                  {"dequantized_vs_float32_prefill": ">= 0.85"}, notes, dtype="per variant")
