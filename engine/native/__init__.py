"""forkv's CPU kernels: quantized matmul and decode attention as mlx primitives, chosen per
ISA at run time.

`load()` builds the extension on first use (build.py) and imports it; `status()` says whether
the kernels are in use and why not (for `forkv doctor`); `kernel_label()` is what the model
fingerprint covers, so records made under one kernel path never restore under another.
The models whose attention runs on them store cached K/V at half width (kvcache.py;
`DEFAULT_KV_DTYPE` unless asked otherwise; q8_0 on request), which the label names too.
`FORKV_NATIVE=off` turns them off; `FORKV_NATIVE_ISA=avx2|scalar` picks a lower ISA than the best;
`FORKV_NATIVE_THREADS` sizes their thread pool; `FORKV_NATIVE_FUSE=off` keeps q/k/v and
gate/up as separate calls (fused.py: the same bits, for comparison) and every layer as
separate kernel calls; `FORKV_NATIVE_BLOCKS=off` only the latter (blocks.py: whole llama and
Gemma 3 decoder layers in two calls, the same bits). Without a compiler, or on
another device than the CPU, forkv runs mlx's own kernels. Knows nothing about models
(layers.py).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

from .build import BuildError, built_library

__all__ = ["DEFAULT_KV_DTYPE", "NativeInfo", "blocks_off", "fuse_off", "kernel_label", "load",
           "status"]

# Bump when a kernel's arithmetic changes (its results, not its speed).
# 2: decode attention, RMS norm and RoPE; 3: activations, prefill attention, groups of 16;
# 4: only a marked class's own code gets the kernels' activations (a model module's compiled
# helpers, e.g. Gemma 4's geglu, keep mlx's); 5: AVX-512's 4/5/6-bit matmuls add the evens'
# and the odds' int32 dot products of an 8-element block before converting them; 6: 8-bit
# weights in the same paired layout (AVX2's 8-bit path sums the two halves as well), and
# AVX-512 (and AVX2 at 8 bits) sums symmetric groups as x * (q - 2^(bits-1)), with no bias
# term after them; 7: mlx-vlm's language models on the kernels too; 8: AVX2's bias terms of
# affine groups end in one FMA a group past the last whole 8 (GCC had compiled that tail
# to a multiply and an add in some instantiations).
KERNEL_VERSION = 8
# What cached K/V are stored in where the kernels run attention, unless asked otherwise:
# half float32's bytes, within 0.5% of its perplexity on Gemma 3 and SmolLM2 (docs/memory.md).
DEFAULT_KV_DTYPE = "float16"


@dataclass(slots=True, frozen=True)
class NativeInfo:
    available: bool
    isa: str = ""
    num_threads: int = 0
    reason: str = ""
    path: str = ""
    matvec: str = ""  # how one-row calls read their weights here (choose_matvec)


_lock = threading.Lock()
_module = None
_info: NativeInfo | None = None


def load(*, build: bool = True):
    """The extension module, or None (then `status().reason` says why)."""
    global _module, _info
    with _lock:
        if _info is not None:
            return _module
        if os.environ.get("FORKV_NATIVE", "").strip().lower() in ("off", "0", "false", "no"):
            _info = NativeInfo(False, reason="turned off (FORKV_NATIVE=off)")
            return None
        if sys.platform != "linux":
            _info = NativeInfo(False, reason=f"built for Linux only (this is {sys.platform})")
            return None
        try:
            path = built_library(build=build)
        except BuildError as e:
            if not build and str(e) == "not built yet":
                return None  # not cached: a later load(build=True) builds it
            _info = NativeInfo(False, reason=str(e))
            return None
        try:
            import mlx.core  # noqa: F401  (the extension shares its types)

            spec = importlib.util.spec_from_file_location("_forkv_native", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            wanted = os.environ.get("FORKV_NATIVE_ISA", "").strip()
            if wanted:
                module.set_isa(wanted)
            matvec = choose_matvec(module)
        except (BuildError, ImportError, OSError, ValueError) as e:
            _info = NativeInfo(False, reason=str(e))
            return None
        _module = module
        _info = NativeInfo(True, module.isa(), module.num_threads(),
                           f"built for mlx in {path.parent}", str(path), matvec)
        return _module


_MATVEC_WAYS = {"tiles": "4-row tiles", "rows": "rows in order",
                "ahead": "rows in order, fetched ahead"}


def choose_matvec(module) -> str:
    """How one-row calls read their weights on this CPU (qgemm.h `set_matvec_tiles`,
    `set_matvec_ahead`): every way gives the same bits, and which is fastest depends on the
    CPU's prefetchers (4-row tiles: Gemma 3's 262K-row head 11.6 -> 9.8 ms on an AVX-512 Xeon;
    rows in order with their next bytes fetched early: a ~1B llama's decode step ~14% faster
    on a Zen 4, where the same fetch had slowed the Xeon), so a one-row call over 42 MB of
    8-bit weights (more than most CPUs' last cache, as a model's head) is timed each way,
    taking turns, and the fastest kept (the tiles unless rows win by 3%); its buffers are
    freed at once. FORKV_NATIVE_MATVEC=tiles, rows or ahead fixes it. What was chosen, with
    the times."""
    wanted = os.environ.get("FORKV_NATIVE_MATVEC", "").strip().lower()
    if wanted:
        if wanted not in _MATVEC_WAYS:
            raise ValueError(f"FORKV_NATIVE_MATVEC={wanted!r} is not a choice; use 'tiles', "
                             "'rows' or 'ahead' (or leave it unset to time each)")
        _set_matvec(module, wanted)
        return f"{_MATVEC_WAYS[wanted]} (FORKV_NATIVE_MATVEC)"
    if module.isa() != "avx512vnni":  # (only the AVX-512 kernels have the choice)
        return ""
    import mlx.core as mx

    N, K = 65536, 640
    w = mx.full((N, K), 0x5A, mx.uint8)  # (8-bit rows in the kernels' layout: values change
    # no timing)
    s = mx.ones((N, K // 32), mx.float32)
    b = mx.zeros((N, K // 32), mx.float32)
    x = mx.full((1, K), 0.5)  # (not mx.random: the process's random state stays as it was)
    mx.eval(w, s, b, x)
    times: dict[str, list[float]] = {way: [] for way in _MATVEC_WAYS}
    for _ in range(6):
        for way in times:
            _set_matvec(module, way)
            t0 = time.perf_counter()
            mx.eval(module.quantized_matmul(x, w, s, b, 8, 32))
            times[way].append(time.perf_counter() - t0)
    del w, s, b, x
    mx.clear_cache()
    median = {way: statistics.median(t[1:]) for way, t in times.items()}
    rows = min(("ahead", "rows"), key=median.get)
    kept = "tiles" if median["tiles"] <= median[rows] * 1.03 else rows
    _set_matvec(module, kept)
    others = "; ".join(f"{_MATVEC_WAYS[way]}: {median[way] * 1e3:.2f}"
                       for way in _MATVEC_WAYS if way != kept)
    return f"{_MATVEC_WAYS[kept]} (a 42 MB matvec: {median[kept] * 1e3:.2f} ms; {others})"


def _set_matvec(module, way: str) -> None:
    module.set_matvec_tiles(way == "tiles")
    module.set_matvec_ahead(way == "ahead")


def status() -> NativeInfo:
    """What `load` found, without building when it has not run yet."""
    if _info is None:
        load(build=False)
    return _info or NativeInfo(False, reason="not built yet: it builds on the first load of a "
                               "quantized model on the CPU, or by `forkv doctor`")


def fuse_off() -> bool:
    """Whether FORKV_NATIVE_FUSE turns the fused projections off (fused.py)."""
    return os.environ.get("FORKV_NATIVE_FUSE", "").strip().lower() in ("off", "0", "false", "no")


def blocks_off() -> bool:
    """Whether FORKV_NATIVE_BLOCKS (or FORKV_NATIVE_FUSE) turns the fused decoder layers off
    (blocks.py)."""
    value = os.environ.get("FORKV_NATIVE_BLOCKS", "").strip().lower()
    return fuse_off() or value in ("off", "0", "false", "no")


def kernel_label(kv_dtype: str = DEFAULT_KV_DTYPE) -> str:
    """forkv's kernel path for the fingerprint ('' when the kernels are not in use), with the
    cached K/V format where it is narrower than float32 (half width, q8_0): records never
    restore under another format."""
    info = status()
    if not info.available:
        return ""
    kv = "" if kv_dtype == "float32" else f"-kv-{kv_dtype}"
    return f"forkv-native-v{KERNEL_VERSION}-{info.isa}{kv}"
