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
import sys
import threading
from dataclasses import dataclass

from .build import BuildError, built_library

__all__ = ["DEFAULT_KV_DTYPE", "NativeInfo", "blocks_off", "fuse_off", "kernel_label", "load",
           "status"]

# Bump when a kernel's arithmetic changes (its results, not its speed).
# 2: decode attention, RMS norm and RoPE; 3: activations, prefill attention, groups of 16;
# 4: only a marked class's own code gets the kernels' activations (a model module's compiled
# helpers, e.g. Gemma 4's geglu, keep mlx's).
KERNEL_VERSION = 4
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
        except (BuildError, ImportError, OSError, ValueError) as e:
            _info = NativeInfo(False, reason=str(e))
            return None
        _module = module
        _info = NativeInfo(True, module.isa(), module.num_threads(),
                           f"built for mlx in {path.parent}", str(path))
        return _module


def status() -> NativeInfo:
    """What `load` found, without building when it has not run yet."""
    if _info is None:
        load(build=False)
    return _info or NativeInfo(False, reason="not built yet: it builds on the first load of a "
                               "quantized model on the CPU (or run `forkv doctor --build`)")


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
