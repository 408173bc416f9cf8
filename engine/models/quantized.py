"""Quantized weights at load: keep them (on forkv's CPU kernels where they run), or dequantize.

On the CPU, forkv's own kernels (engine/native) multiply the quantized groups directly, at a
fraction of float32's bytes; `quantized="auto"` and `"keep"` use them whenever they are built
and support every quantized layer. Without them, mlx's CPU quantized matmul is 20-40x slower
than its BLAS float path, so `"auto"` dequantizes when the float weights fit in memory (with a
margin) and keeps them otherwise; a GPU keeps them (its quantized kernels are fast).
`"dequantize"` always dequantizes. `apply_quantized` returns a `QuantChoice`: a short label
that the fingerprint covers (two loads that compute differently never share block keys) and
the reason, for `forkv doctor`. Knows mlx modules; nothing about files or names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ModelLoadError

__all__ = ["MODES", "QuantChoice", "apply_quantized", "describe_quantization"]

MODES = ("auto", "keep", "dequantize")
_MARGIN = 1.25  # dequantized weights must fit 1.25x over in available memory


@dataclass(slots=True, frozen=True)
class QuantChoice:
    label: str  # "none", "4-bit kept", "4-bit on forkv-native avx512vnni", "4-bit dequantized ..."
    reason: str
    dequantized: bool
    native: bool = False  # the quantized layers run on forkv's CPU kernels


def describe_quantization(config: dict) -> str | None:
    """"4-bit", "mixed 4/8-bit", "mxfp4 4-bit" for a quantized config; None when it is not."""
    quant = config.get("quantization") or config.get("quantization_config")
    if not isinstance(quant, dict) or "bits" not in quant:
        return None
    bits = {quant["bits"]} | {v["bits"] for v in quant.values()
                              if isinstance(v, dict) and "bits" in v}
    mode = quant.get("mode", "affine")
    text = (f"{bits.pop()}-bit" if len(bits) == 1
            else f"mixed {'/'.join(str(b) for b in sorted(bits))}-bit")
    return text if mode == "affine" else f"{mode} {text}"


def apply_quantized(model, config: dict, mode: str, dtype: str,
                    kernel_groups=None, kv_dtype: str = "float32",
                    kernel_params=None) -> QuantChoice:
    """Keep or dequantize `model`'s quantized layers in place; `dtype` is the compute dtype
    the float weights will be cast to (itemsize for the memory estimate). `kernel_groups` and
    `kernel_params`, functions returning `use_kernel_groups`' dict and the K-quant params by path,
    are called only when the kernels are used;
    `kv_dtype` (the cached K/V format asked for, which the loader applies to float32 models) is
    named in the kernels' label."""
    import mlx.core as mx

    if mode not in MODES:
        raise ModelLoadError(f"Unknown quantized mode {mode!r}; choose one of "
                             f"{', '.join(MODES)}.")
    what = describe_quantization(config)
    if what is None or not _quantized_modules(model):
        return _float_kernels(model, QuantChoice("none", "the weights are not quantized",
                                                 False), dtype)
    need = dequantized_bytes(model, getattr(mx, dtype).size)
    if mode != "dequantize" and mx.default_device() == mx.cpu:
        choice, why_not = _try_native(model, what, kernel_groups, kv_dtype, kernel_params)
        if choice is not None:
            return choice
    else:
        why_not = ""
    if mode == "auto":
        if mx.default_device() != mx.cpu:
            return QuantChoice(f"{what} kept", "auto: quantized kernels are fast on "
                               f"{mx.default_device()}", False)
        have = available_memory()
        if have is not None and need * _MARGIN > have:
            return QuantChoice(f"{what} kept", f"auto: {dtype} weights ({_gib(need)}) would "
                               f"not fit in available memory ({_gib(have)})", False)
        reason = (f"auto: forkv's kernels are not in use ({why_not}); mlx's CPU quantized "
                  f"matmul is far slower than float BLAS, and {dtype} weights ({_gib(need)}) "
                  f"fit in memory ({_gib(have)} available)")
    elif mode == "keep":
        return QuantChoice(f"{what} kept", f"quantized=keep on mlx's kernels ({why_not})"
                           if why_not else "quantized=keep", False)
    else:
        reason = f"quantized=dequantize ({dtype} weights: {_gib(need)})"
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())  # now, so the packed weights are freed before any request
    return _float_kernels(model, QuantChoice(f"{what} dequantized to {dtype}", reason, True),
                          dtype)


def _float_kernels(model, choice: QuantChoice, dtype: str) -> QuantChoice:
    """A float32 model on the CPU: attention, norms, RoPE and MLP activations on forkv's
    kernels (its matmuls stay on BLAS). mlx's CPU attention is unfused: one 89-token chunk
    over 6K keys costs ~46 ms a layer on a 4-head model, against ~2 ms on the kernel. The
    choice says `native`, so the fingerprint names the kernels; without them it is unchanged."""
    import mlx.core as mx

    if dtype != "float32" or mx.default_device() != mx.cpu:
        return choice
    from .. import native

    lib = native.load()
    if lib is None:
        return choice
    from ..native.activations import use_native_activations
    from ..native.attention import use_native_attention
    from ..native.rowwise import use_native_rowwise

    attention = use_native_attention(model, lib)
    norms, ropes = use_native_rowwise(model, lib)
    mlps = use_native_activations(model, lib)
    if not (attention or norms or ropes or mlps):
        return choice
    info = native.status()
    return QuantChoice(choice.label, f"{choice.reason}; {attention} attention layers, {norms} "
                       f"norms, {ropes} ropes and {mlps} MLP activations on forkv's CPU "
                       f"kernels ({info.isa}, {info.num_threads} threads)", choice.dequantized,
                       native=True)


def _try_native(model, what: str, kernel_groups=None, kv_dtype: str = "float32",
                kernel_params=None) -> tuple[QuantChoice | None, str]:
    """Move the quantized layers onto forkv's kernels: (the choice, "") or (None, why not)."""
    from .. import native

    lib = native.load()
    if lib is None:
        return None, native.status().reason
    from ..native.activations import use_native_activations
    from ..native.attention import use_native_attention
    from ..native.blocks import use_native_blocks
    from ..native.fused import fuse_projections
    from ..native.layers import pack_weights, unsupported, use_kernel_groups, use_native
    from ..native.rowwise import use_native_rowwise

    missing = unsupported(model)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return None, f"the kernels do not run {', '.join(missing[:3])}{more}"
    # the K-quants' own super-block scales: the same values in fewer bytes (not in the label)
    params = kernel_params() if kernel_params else None
    count = use_native(model, lib, params)
    groups = use_kernel_groups(model, lib, kernel_groups(), params) if kernel_groups else 0
    if groups:  # float in the folder for mlx, exact groups on the kernels: a new computation
        what = f"{what} + {groups} layers 6-bit/16"
        count += groups
    # q/k/v and gate/up in one call each: the same bits (fused.py), fewer calls a layer
    fused = 0 if native.fuse_off() else fuse_projections(model)
    attention = use_native_attention(model, lib)
    norms, ropes = use_native_rowwise(model, lib)
    mlps = use_native_activations(model, lib)
    # after the others: a layer is fused only where each of its pieces is on the kernels
    blocks = 0 if native.blocks_off() else use_native_blocks(model, lib)
    huge = pack_weights(model, lib)  # (the same bits; aligned, fewer TLB misses)
    info = native.status()
    if kv_dtype == "auto":
        kv_dtype = native.DEFAULT_KV_DTYPE
    label = native.kernel_label(kv_dtype if attention else "float32")
    return QuantChoice(f"{what} on {label}", f"{count} quantized layers "
                       f"({fused} groups fused), "
                       f"{attention} attention layers, {norms} norms, {ropes} ropes and "
                       f"{mlps} MLP activations ({blocks} decoder layers in two calls) "
                       f"on forkv's CPU kernels ({info.isa}, {info.num_threads} threads; "
                       f"{huge >> 20} MiB of weights in 2 MiB pages)", False,
                       native=True), ""


def dequantized_bytes(model, itemsize: int) -> int:
    """Bytes of every parameter once the quantized layers are float, at `itemsize`."""
    from mlx.utils import tree_flatten

    total = sum(v.size for _, v in tree_flatten(model.parameters()))
    for m in _quantized_modules(model):
        packed = m.weight.size + m.scales.size + (m.biases.size if "biases" in m else 0)
        total += m.weight.size * 32 // m.bits - packed
    return total * itemsize


def available_memory() -> int | None:
    """Bytes the system can give without swapping (Linux MemAvailable), else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _quantized_modules(model) -> list:
    return [m for _, m in model.named_modules()
            if hasattr(m, "bits") and hasattr(m, "group_size") and "scales" in m]


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"
