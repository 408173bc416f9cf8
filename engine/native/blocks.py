"""Whole decoder layers on forkv's kernels for the families we name: llama and Gemma 3.

With the rest of engine/native a layer of SmolLM2 (llama) still builds ~27 mlx graph nodes a
decode step (norms, the q/k/v and gate/up matmuls, three reshapes and transposes each way,
ropes, casts, attention, residual adds), each costing more to build in Python and dispatch
than to compute. `use_native_blocks(model, lib)` gives the model's `TransformerBlock`s a
same-named subclass whose `__call__` makes two kernel calls around mlx-lm's own cache update
(block.h): `attn_in` (input norm, q/k/v, Gemma's q/k norms, ropes, the cast to the cache's
dtype) and `block_out` (attention, o_proj, residual, the MLP with its norms, residual). Each
calls the kernel functions the separate primitives run, in the same order, so the results
are the bits of mlx-lm's code on the kernels (tests/test_native_blocks.py); the fingerprint
does not change. mlx-lm's batch caches (the engine's merged rows) are taken too: their
per-row offsets go to the ropes as the rope primitive takes them, and the left padding and
the window are in the mask the attention kernel reads, so a row's bits do not depend on the
rows beside it. Any call the kernels would not take whole (another dtype, no cache, a
quantized cache, a mask the attention kernel does not take) runs mlx-lm's own code, which
stays the reference. A layer is converted only where every piece is already on the kernels:
kernel linears without biases, the kernels' norms, RoPE, attention and activation.
`FORKV_NATIVE_BLOCKS=off` (or `FORKV_NATIVE_FUSE=off`) keeps the separate calls.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import activations, attention, rowwise
from .attention import _ring_rotation
from .fused import FusedMember, FusedProjections
from .kvcache import kv_dtype_of
from .layers import NativeQuantizedLinear
from .swap import subclass_with_call

__all__ = ["FAMILIES", "use_native_blocks"]

# The layer classes, and (their MLP's class, its activation, whether the activation call
# takes the up projection: swiglu) for each.
FAMILIES = {
    "mlx_lm.models.llama.TransformerBlock": ("mlx_lm.models.llama.MLP", "silu", True),
    "mlx_lm.models.gemma3_text.TransformerBlock": ("mlx_lm.models.gemma3_text.MLP",
                                                   "gelu_approx", False),
}
_ATTENTION = {"mlx_lm.models.llama.TransformerBlock": "mlx_lm.models.llama.Attention",
              "mlx_lm.models.gemma3_text.TransformerBlock":
                  "mlx_lm.models.gemma3_text.Attention"}
_CACHES = ("KVCache", "RotatingKVCache")  # mlx-lm's single-sequence caches (int offsets)
# mlx-lm's batch caches (the engine's merged decode): an offset per row, left padding masked
_BATCH_CACHES = ("BatchKVCache", "BatchRotatingKVCache")
_subclasses: dict[type, type] = {}


def _name(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _linears(module, names: tuple[str, ...]) -> list | None:
    """The kernel layers computing `names` in order: their fused group or one each."""
    first = getattr(module, names[0], None)
    if type(first) is FusedProjections:
        rest = [getattr(module, n, None) for n in names[1:]]
        ok = len(first._widths) == len(names) and all(
            type(m) is FusedMember and m._owner is first and m._index == i
            for i, m in enumerate(rest, 1))
        layers = [first] if ok else None
    else:
        layers = [getattr(module, n, None) for n in names]
        if not all(type(m) is NativeQuantizedLinear for m in layers):
            return None
    if any("bias" in m or m.mode != "affine" or m["scales"].ndim != 2 for m in layers):
        return None
    return layers


def _specs(layers: list, start: int = 0) -> tuple[list[list[int]], list[tuple[str, ...]]]:
    """Each layer's [w, scales, biases or -1, bits, group_size, widths...] over the arrays
    its keys name, counted from `start`."""
    specs, keys = [], []
    at = start
    for m in layers:
        names = ("weight", "scales") + (("biases",) if "biases" in m else ())
        widths = list(getattr(m, "_widths", (m["scales"].shape[0],)))
        specs.append([at, at + 1, at + 2 if len(names) == 3 else -1, m.bits, m.group_size,
                      *widths])
        keys.append(names)
        at += len(names)
    return specs, keys


def _is_native(module, table: dict) -> bool:
    return type(module) in table.values()


class _Plan:
    """What a converted layer's calls read besides its parameters: fixed at conversion."""

    __slots__ = ("attn_in", "attn_keys", "attn_specs", "out_layers", "out_keys", "out_specs",
                 "counts", "eps", "offset", "qk_eps", "sandwich", "act", "act_mul")


def _plan(block) -> _Plan | None:
    family = FAMILIES.get(_name(block))
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    if family is None or attn is None or mlp is None:
        return None
    mlp_class, act, act_mul = family
    gemma = "gemma3" in _name(block)
    rope = getattr(attn, "rope", None)
    norms = [block.input_layernorm, block.post_attention_layernorm]
    if gemma:
        norms += [block.pre_feedforward_layernorm, block.post_feedforward_layernorm]
    qk = [attn.q_norm, attn.k_norm] if gemma else []
    qkv = _linears(attn, ("q_proj", "k_proj", "v_proj"))
    o = _linears(attn, ("o_proj",))
    gate_up = _linears(mlp, ("gate_proj", "up_proj"))
    down = _linears(mlp, ("down_proj",))
    if (None in (qkv, o, gate_up, down) or _name(attn) != _ATTENTION[_name(block)]
            or _name(mlp) != mlp_class
            or not _is_native(attn, attention._subclasses)
            or not _is_native(mlp, activations._subclasses)
            or type(rope) is not rowwise._subclasses.get(nn.RoPE)
            or not isinstance(rope.base, (int, float))
            or not all(_is_native(n, rowwise._subclasses) for n in norms + qk)
            or len({n.eps for n in norms}) != 1 or len({n.eps for n in qk}) > 1
            or attn.head_dim % 16 or attn.n_heads % attn.n_kv_heads):
        return None
    p = _Plan()
    p.attn_specs, p.attn_keys = _specs(qkv)
    p.attn_in = qkv
    p.out_layers = o + gate_up + down
    p.out_specs, p.out_keys = _specs(p.out_layers)
    p.counts = [len(o), len(gate_up)]
    p.eps = norms[0].eps
    p.offset = 1.0 if gemma else 0.0
    p.qk_eps = qk[0].eps if qk else 0.0
    p.sandwich = gemma
    p.act, p.act_mul = act, act_mul
    return p


def _plain(module, name: str, value) -> None:
    object.__setattr__(module, name, value)  # kept out of mlx's parameter tree


def _arrays(layers: list, keys: list) -> list:
    return [m[k] for m, names in zip(layers, keys) for k in names]


def _takes(x, mask, cache) -> bool:
    """Whether the kernels take this call whole (else mlx-lm's code runs it)."""
    if x.dtype != mx.float32 or x.ndim != 3 or cache is None or hasattr(cache, "bits"):
        return False
    name = type(cache).__name__
    if name in _BATCH_CACHES:
        if not (isinstance(cache.offset, mx.array) and cache.offset.shape == (x.shape[0],)):
            return False
    elif name not in _CACHES or not isinstance(cache.offset, int):
        return False
    if mask is None:
        return True
    if isinstance(mask, str):
        return mask == "causal"
    return isinstance(mask, mx.array) and (mask.dtype == mx.bool_
                                           or mx.issubdtype(mask.dtype, mx.floating))


def _block_class(cls: type) -> type:
    def __call__(self, x, mask=None, cache=None):
        p = self._forkv_plan
        if not _takes(x, mask, cache):
            return cls.__call__(self, x, mask, cache)
        lib, attn = self._forkv_lib, self.self_attn
        rope = attn.rope
        qk = [attn.q_norm["weight"], attn.k_norm["weight"]] if p.sandwich else []
        rows = cache.offset if isinstance(cache.offset, mx.array) else None  # batch cache
        q, k, v = lib.attn_in(x, self.input_layernorm["weight"], qk,
                              _arrays(p.attn_in, p.attn_keys), p.attn_specs, p.eps, p.offset,
                              p.qk_eps, attn.n_heads, attn.n_kv_heads, attn.head_dim,
                              rope.dims, rope.traditional, rope.base, rope.scale,
                              0 if rows is not None else cache.offset, kv_dtype_of(cache),
                              rows)
        keys, values = cache.update_and_fetch(k, v)
        if isinstance(mask, str):  # "causal", as attention.attention reads it
            mask, causal, rot = None, x.shape[1] > 1, 0
        else:
            causal, rot = False, _ring_rotation(cache, x.shape[1], keys.shape[2])
        norms = ([self.post_attention_layernorm["weight"],
                  self.pre_feedforward_layernorm["weight"],
                  self.post_feedforward_layernorm["weight"]] if p.sandwich
                 else [self.post_attention_layernorm["weight"]])
        return lib.block_out(q, keys, values, mask, causal, rot, attn.scale, x, norms,
                             _arrays(p.out_layers, p.out_keys), p.out_specs,
                             p.counts, p.eps, p.offset, p.act, p.act_mul)

    return subclass_with_call(cls, __call__, _subclasses)


def use_native_blocks(model, lib) -> int:
    """Convert `model`'s llama and Gemma 3 layers whose pieces are all on the kernels (run
    after the other conversions); returns how many."""
    count = 0
    for _, m in model.named_modules():
        if type(m) in _subclasses.values():
            count += 1
            continue
        plan = _plan(m)
        if plan is None:
            continue
        _plain(m, "_forkv_plan", plan)
        m.__class__ = _block_class(type(m))
        m._forkv_lib = lib
        count += 1
    return count
