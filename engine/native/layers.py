"""mlx-lm's quantized layers on forkv's kernels: `use_native(model, lib)` converts them in place.

A `QuantizedLinear` becomes a `NativeQuantizedLinear` (same module, same parameter names; the
weight repacked for 5/6/8 bits, scales and biases float32; symmetric groups, a GGUF's Q8_0, Q4_0,
Q5_0 and Q6_K, keep no biases and f16 scales as float16: see `_kernel_arrays`; a GGUF's K-quants
keep their own super-block params as uint8 `scales` instead: `take_kernel_params`) and a
`QuantizedEmbedding` a
`NativeQuantizedEmbedding`, whose lookups stay mlx's and whose `as_linear` (a tied head) runs
on the kernels. Only affine groups of 32, 64 or 128 at 4, 5, 6 or 8 bits with an input size
that is a multiple of 64 are supported (`unsupported` lists the rest). `use_kernel_groups`
also turns float `Linear` layers into kernel layers from exact triples whose groups mlx cannot
hold (a GGUF's Q6_K: 6 bits in groups of 16). Knows mlx modules and the extension's calls;
nothing about files, devices or fingerprints.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

__all__ = ["NativeGroupsEmbedding", "NativeQuantizedEmbedding", "NativeQuantizedLinear",
           "expand_kparams", "kernel_keys", "lookup_rows", "mlx_rows8", "take_kernel_params",
           "unsupported", "use_kernel_groups", "use_native"]

_BITS = (4, 5, 6, 8)
_GROUPS = (32, 64, 128)


class NativeQuantizedLinear(nn.QuantizedLinear):
    """A QuantizedLinear whose matmul runs on forkv's CPU kernels."""

    _lib = None

    def __call__(self, x):
        y = self._lib.quantized_matmul(x, self["weight"], self["scales"], self.get("biases"),
                                       self.bits, self.group_size)
        return y + self["bias"] if "bias" in self else y


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    """A QuantizedEmbedding whose `as_linear` (a tied output head) runs on the kernels.

    With symmetric groups (a GGUF's Q8_0 token_embd) it keeps no float32 scales and biases
    for its lookups: they are the kernels' float16 scales widened, and each bias
    -2^(bits-1) times its scale, bit for bit (`_compact` checked both), so a lookup derives
    them for the rows it gathers and `mx.dequantize` gets the very inputs it got before.
    Gemma 3's 262K-row table keeps 40 MiB fewer. `lookup_dtype`: the dtype the float weights
    were cast to (the loader's), which those scales and biases would have been cast to."""

    _lib = None
    lookup_dtype = mx.float32

    def __call__(self, x):
        # 4-bit rows are mlx's packing, shared with the kernels (5/6-bit: mlx's copy kept);
        # 8-bit ones exist only in the kernels' layout, and the rows looked up are put back in
        # mlx's (the same bytes)
        rows = (self["weight"][x] if "weight" in self
                else mlx_rows8(self["kernel_weight"][x]))
        if "scales" in self:
            scales, biases = self["scales"][x], self.get("biases")
            biases = biases[x] if biases is not None else None
        else:
            scales = self["kernel_scales"][x].astype(mx.float32)
            biases = scales * -float(1 << (self.bits - 1))
            if self.lookup_dtype != mx.float32:
                scales, biases = (scales.astype(self.lookup_dtype),
                                  biases.astype(self.lookup_dtype))
        return mx.dequantize(rows, scales=scales, biases=biases,
                             group_size=self.group_size, bits=self.bits, mode=self.mode)

    def as_linear(self, x):
        return self._lib.quantized_matmul(x, self["kernel_weight"], self["kernel_scales"],
                                          self.get("kernel_biases"), self.bits, self.group_size)


class NativeGroupsEmbedding(nn.Embedding):
    """A float `Embedding` whose `as_linear` (a tied output head) runs on the kernels from the
    exact groups its float weight was dequantized from (a GGUF's Q6_K token_embd): the head
    reads ~1/5 of the bytes. Where the groups are symmetric and the float table was stored in
    float32, the table itself is dropped and a lookup dequantizes the rows it gathers from the
    groups (`lookup_rows`): each value is `scale * (q - 2^(bits-1))`, a product exact in
    float32 and the very product gguf-py's dequantize made the table with, so a looked-up row
    has the table's bits (zeros' signs included). A 1B model's 49K x 2,048 table is 403 MB in
    float32; the groups hold it in ~80. `lookup_dtype` as NativeQuantizedEmbedding's."""

    _lib = None
    lookup_dtype = mx.float32

    def __call__(self, x):
        if "weight" in self:
            return super().__call__(x)
        rows = lookup_rows(self["kernel_weight"], self["kernel_scales"], x, self.bits,
                           self.group_size)
        return rows if self.lookup_dtype == mx.float32 else rows.astype(self.lookup_dtype)

    def _extra_repr(self):
        return f"groups of {self.group_size} at {self.bits} bits"

    def as_linear(self, x):
        return self._lib.quantized_matmul(x, self["kernel_weight"], self["kernel_scales"],
                                          self.get("kernel_biases"), self.bits, self.group_size)


def expand_kparams(kp, group_size: int):
    """(scales, biases or None), float32, of K-quant params (uint8 [..., K/256 * 20 or 18];
    qgemm.h's `kparams_bytes`): d * sc and -(dmin * m) per group, what the kernels widen them
    to."""
    *lead, P = kp.shape
    bb = 18 if group_size == 16 else 20
    blocks = kp.reshape(*lead, P // bb, bb)
    d = blocks[..., 0:2].view(mx.float16).astype(mx.float32)
    if group_size == 16:
        sc = blocks[..., 2:18].view(mx.int8).astype(mx.float32)
        return (d * sc).reshape(*lead, -1), None
    dmin = blocks[..., 2:4].view(mx.float16).astype(mx.float32)
    scales = d * blocks[..., 4:12].astype(mx.float32)
    biases = -(dmin * blocks[..., 12:20].astype(mx.float32))
    return scales.reshape(*lead, -1), biases.reshape(*lead, -1)


def take_kernel_params(m, kp) -> bool:
    """Give kernel layer `m` (a NativeQuantizedLinear, or a NativeGroupsEmbedding's head) the
    K-quant params `kp` (uint8, a GGUF's own super-block scales) in place of its float32 scales
    and biases, if they widen to exactly those, bit for bit (checked here): the kernels read
    ~1/3 of the bytes for them (Q4_K: 4.6 bits a weight instead of 6) and compute the same.
    Whether it took them."""
    if type(m) is NativeQuantizedLinear:
        names = ("scales", "biases")
    elif type(m) is NativeGroupsEmbedding:
        names = ("kernel_scales", "kernel_biases")
    else:
        return False
    if m.group_size not in (16, 32) or (m.bits == 6) != (m.group_size == 16) or m.bits > 6:
        return False
    scales, biases = expand_kparams(kp, m.group_size)
    have_scales, have_biases = m[names[0]], m.get(names[1])
    if scales.shape != have_scales.shape or (biases is None) != (have_biases is None):
        return False
    same = mx.array_equal(scales.view(mx.uint32), have_scales.astype(mx.float32).view(mx.uint32))
    if biases is not None:
        same = same & mx.array_equal(biases.view(mx.uint32), have_biases.view(mx.uint32))
    if not same.item():
        return False
    m[names[0]] = kp
    if names[1] in m:
        del m[names[1]]
    return True


def mlx_rows8(rows):
    """8-bit rows in the kernels' layout (uint8 [..., K]; qgemm.h: per 128 values the evens of
    two chunks of 64, then their odds; a lone last chunk its evens, then its odds) in mlx's
    packing (uint32 [..., K / 4]), byte for byte what `repack` was given."""
    *lead, K = rows.shape
    pairs = K // 128
    parts = []
    if pairs:  # [pair, parity, chunk, i] -> [pair, chunk, i, parity]
        head = rows[..., :128 * pairs].reshape(*lead, pairs, 2, 2, 32)
        parts.append(mx.moveaxis(head, -3, -1).reshape(*lead, 128 * pairs))
    if K % 128:  # [parity, i] -> [i, parity]
        tail = rows[..., 128 * pairs:].reshape(*lead, 2, 32)
        parts.append(mx.swapaxes(tail, -1, -2).reshape(*lead, 64))
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    return mx.contiguous(out).view(mx.uint32)


def lookup_rows(weight, scales, ids, bits: int, group_size: int):
    """Rows `ids` of symmetric groups in the kernels' layout (`weight` [N, row bytes] uint8 for
    5/6/8 bits, mlx's uint32 packing for 4; `scales` [N, K/group_size] float16 or float32, or
    K-quant params) dequantized to float32: `scale * (q - 2^(bits-1))` for each value. Only
    the gathered rows are unpacked."""
    rows = weight[ids]
    if rows.dtype != mx.uint8:
        rows = rows.view(mx.uint8)
    lead = rows.shape[:-1]
    if bits == 8:
        q = mlx_rows8(rows).view(mx.uint8)
    else:  # per chunk of 64: 32 bytes of nibbles (elements 2b, 2b + 1), then the bit planes
        chunk = 32 + 8 * (bits - 4)
        rows = rows.reshape(*lead, -1, chunk)
        nib = rows[..., :32]
        q = mx.stack([nib & 15, nib >> 4], axis=-1).reshape(*lead, -1, 64)
        shifts = mx.arange(8, dtype=mx.uint8)
        for plane in range(bits - 4):
            planes = rows[..., 32 + 8 * plane:40 + 8 * plane]
            at = ((planes[..., None] >> shifts) & 1).reshape(*lead, -1, 64)  # by position
            # position i < 32 holds element 2i, i >= 32 element 2(i - 32) + 1
            q = q | (mx.stack([at[..., :32], at[..., 32:]], axis=-1)
                     .reshape(*lead, -1, 64) << (4 + plane))
        q = q.reshape(*lead, -1)
    scales = scales[ids]
    if scales.dtype == mx.uint8:  # K-quant params (symmetric: the biases are derived)
        scales = expand_kparams(scales, group_size)[0]
    s = mx.repeat(scales.astype(mx.float32), group_size, axis=-1)
    return s * (q.astype(mx.float32) - float(1 << (bits - 1)))


def _is_candidate(m) -> bool:
    return type(m) in (nn.QuantizedLinear, nn.QuantizedEmbedding)


def _problem(m) -> str | None:
    if getattr(m, "mode", "affine") != "affine":
        return f"mode {m.mode}"
    if m.bits not in _BITS:
        return f"{m.bits}-bit"
    if m.group_size not in _GROUPS:
        return f"group size {m.group_size}"
    if "biases" not in m:
        return "no biases"
    in_dims = m["scales"].shape[-1] * m.group_size
    if in_dims % 64:
        return f"input size {in_dims} (not a multiple of 64)"
    return None


def unsupported(model) -> list[str]:
    """'path: why' for every quantized module the kernels cannot run (empty when none)."""
    out = []
    for path, m in model.named_modules():
        if hasattr(m, "bits") and "scales" in m and not _is_candidate(m):
            out.append(f"{path}: {type(m).__name__}")
        elif _is_candidate(m) and (why := _problem(m)):
            out.append(f"{path}: {why}")
    return out


def kernel_keys(module) -> tuple[str, ...]:
    """Parameters the kernels read as they are: a dtype cast must leave them alone."""
    if isinstance(module, NativeQuantizedLinear):
        return ("scales", "biases")
    if isinstance(module, (NativeQuantizedEmbedding, NativeGroupsEmbedding)):
        return ("kernel_scales", "kernel_biases")
    return ()


def _kernel_arrays(lib, weight, scales, biases, bits: int, group_size: int):
    """mlx-packed affine groups as the kernels read them: 5/6/8-bit rows repacked, float32
    scales and biases (None for symmetric groups; see `_compact`)."""
    if bits in (5, 6, 8):
        weight = lib.repack(weight, scales.shape[-1] * group_size, bits)
    scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
    return (weight, *_compact(scales, biases, bits))


def _compact(scales, biases, bits: int):
    """(scales, None) when every bias is -2^(bits-1) times its scale, bit for bit (a GGUF's
    symmetric blocks): the kernels derive each bias exactly and read ~20% fewer bytes; the
    scales float16 too where every one is an f16 value. Otherwise (scales, biases) as given."""
    as_bits = mx.array_equal(biases.view(mx.uint32),
                             (scales * -float(1 << (bits - 1))).view(mx.uint32))
    if not as_bits.item():
        return scales, biases
    half = scales.astype(mx.float16)
    if mx.array_equal(half.astype(mx.float32).view(mx.uint32), scales.view(mx.uint32)).item():
        return half, None
    return scales, None


def _set_kernel_arrays(m, names: tuple[str, str, str], arrays) -> None:
    for name, value in zip(names, arrays):
        if value is not None:
            m[name] = value
        elif name in m:
            del m[name]


def use_native(model, lib, params: dict | None = None) -> int:
    """Convert every supported quantized layer of `model` in place; returns how many. A layer
    at a path of `params` ({path: K-quant params}) takes those (`take_kernel_params`) before
    the next layer's weights are read: the float32 scales they replace are never all in memory
    at once."""
    count = 0
    for path, m in model.named_modules():
        if not _is_candidate(m) or _problem(m):
            continue
        weight, scales, biases = _kernel_arrays(lib, m["weight"], m["scales"], m["biases"],
                                                m.bits, m.group_size)
        if isinstance(m, nn.QuantizedLinear):
            _set_kernel_arrays(m, ("weight", "scales", "biases"), (weight, scales, biases))
            m.__class__ = NativeQuantizedLinear
        else:  # lookups keep mlx's arrays; 4-bit weights are shared, not copied, and 8-bit
            # ones, repacked, are looked up from the kernels' copy (mlx_rows8)
            _set_kernel_arrays(m, ("kernel_weight", "kernel_scales", "kernel_biases"),
                               (weight, scales, biases))
            if m.bits == 8:
                del m["weight"]
            if biases is None:  # lookups derive them from the kernel scales
                del m["scales"], m["biases"]
            m.__class__ = NativeQuantizedEmbedding
        m._lib = lib
        if params and path in params:
            take_kernel_params(m, params.pop(path))  # (popped: freed with the layer's float)
        count += 1
        mx.eval(m.parameters())  # (not the whole model's: use_kernel_groups may drop some)
    return count


def use_kernel_groups(model, lib, groups: dict, params: dict | None = None) -> int:
    """Replace each float `Linear` at a path of `groups` ({path: (weight, scales, biases,
    bits, group_size)}, mlx packing) by a kernel layer computing those exact groups, and give
    a float `Embedding` there that is also the output head (no `lm_head`) a kernel head, and
    one whose table the groups give exactly lookups from the groups (NativeGroupsEmbedding);
    returns how many. Other paths, and shapes that do not match, are left alone. `params`: as
    use_native's. Both take their entries out of `groups` and `params` as they use them."""
    from mlx.utils import tree_unflatten

    modules = dict(model.named_modules())
    tied = not any(p.rsplit(".", 1)[-1] == "lm_head" for p in modules)
    replaced = []
    # Each entry is popped as it is converted, so that its sources (mlx-packed 5/6-bit rows
    # before their repacking, float32 scales the K-quant params replace) are freed with it:
    # held to the end, a 1B Q4_K_M GGUF's load peaked 290 MiB above the model.
    for path in list(groups):
        weight, scales, biases, bits, group_size = groups.pop(path)
        m = modules.get(path)
        in_dims = scales.shape[-1] * group_size
        if (type(m) not in (nn.Linear, nn.Embedding)
                or tuple(m.weight.shape) != (scales.shape[0], in_dims)
                or bits not in (4, 5, 6) or in_dims % 64):
            continue
        if type(m) is nn.Embedding:
            arrays = _kernel_arrays(lib, weight, scales, biases, bits, group_size)
            exact_rows = arrays[2] is None and m.weight.dtype == mx.float32
            if tied or exact_rows:
                _set_kernel_arrays(m, ("kernel_weight", "kernel_scales", "kernel_biases"),
                                   arrays)
                m.group_size, m.bits = group_size, bits
                if exact_rows:  # (never read: the loader evaluates the weights after this)
                    del m["weight"]
                m.__class__ = NativeGroupsEmbedding
                m._lib = lib
                if params and path in params:
                    take_kernel_params(m, params.pop(path))
                mx.eval(m.parameters())
                replaced.append(None)
            continue
        q = NativeQuantizedLinear.__new__(NativeQuantizedLinear)
        nn.Module.__init__(q)
        q.group_size, q.bits, q.mode = group_size, bits, "affine"
        _set_kernel_arrays(q, ("weight", "scales", "biases"),
                           _kernel_arrays(lib, weight, scales, biases, bits, group_size))
        if "bias" in m:
            q["bias"] = m["bias"]
        q._lib = lib
        if params and path in params:
            take_kernel_params(q, params.pop(path))
        mx.eval(q.parameters())
        q.freeze()
        replaced.append((path, q))
    if replaced:
        model.update_modules(tree_unflatten([r for r in replaced if r is not None]))
        mx.eval(model.parameters())
    return len(replaced)


def pack_weights(model, lib, chunk_bytes: int = 64 << 20) -> int:
    """Move every parameter of `model` into buffers of the kernels' own (lib.pack_arrays),
    the same values: each array starts on a cache line (unaligned rows cost the kernels' wide
    loads a second load) and, where Linux allows it, on 2 MiB pages (a decode step reads
    every weight once: on 4 KiB pages the 1B GGUF's matmuls took 11-19% longer, TLB misses).
    Buffers of ~`chunk_bytes`, each swapped in before the next is made, so the load holds at
    most one chunk twice. Returns the bytes on huge pages. FORKV_HUGE_PAGES=off: aligned
    only. Arrays held twice in the model (tied embeddings) stay one array."""
    from mlx.utils import tree_flatten, tree_unflatten

    huge = os.environ.get("FORKV_HUGE_PAGES", "").strip().lower() not in ("off", "0", "false",
                                                                           "no")
    by_id: dict[int, list[str]] = {}
    arrays: dict[int, mx.array] = {}
    for path, v in tree_flatten(model.parameters()):
        by_id.setdefault(id(v), []).append(path)
        arrays[id(v)] = v
    chunks: list[list[int]] = [[]]
    size = 0
    for key, v in arrays.items():
        if chunks[-1] and size + v.nbytes > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(key)
        size += v.nbytes
    on_huge = 0
    for keys in chunks:
        if not keys:
            continue
        copies, covered = lib.pack_arrays([arrays[k] for k in keys], huge)
        on_huge += covered
        model.update(tree_unflatten([(path, c) for k, c in zip(keys, copies)
                                     for path in by_id[k]]))
        for k in keys:  # (the old array goes as the model lets go of it)
            del arrays[k]
    return on_huge
