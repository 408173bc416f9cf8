"""Projections that read the same input in one kernel call: q/k/v, and an MLP's gate and up.

mlx-lm's attention calls `self.q_proj(x), self.k_proj(x), self.v_proj(x)` and its gated MLPs
`self.gate_proj(x)` and `self.up_proj(x)`: on the kernels that is three (two) calls that each
quantize `x`, wake the thread pool and add a graph node, for matmuls of a few hundred
columns at decode. `fuse_projections(model)` gives such a group one kernel layer over the
rows of all its weights (concatenated once, the originals dropped: no second copy): the first
member called computes every member's columns and the others take theirs for the same `x`
(by identity), so the model's own code is unchanged. Each output column is the dot product
the kernel computes for that weight row whatever the other rows of the call (qgemm.h), so the
results are the bits of the separate calls (tests/test_native.py). A member called with
another `x`, or twice, computes the group again: never a stale result; and a group is fused
only where its module's own code calls every member on the same name (so cross-attention,
whose keys read another input, keeps separate calls rather than computing the group twice).
"""

from __future__ import annotations

import inspect
import re

import mlx.core as mx
import mlx.nn as nn

from .layers import NativeQuantizedLinear

__all__ = ["FusedMember", "FusedProjections", "fuse_projections"]

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProjections(NativeQuantizedLinear):
    """A kernel layer over the concatenated rows of a group's weights; its first member."""

    _lib = None

    def __call__(self, x):
        return self.take(x, 0)

    def take(self, x, i: int):
        """Member `i`'s output for `x`: from this call's shared result where there is one."""
        stash = self._stash
        if stash is None or stash[0] is not x or i not in stash[2]:
            # one call, each member's columns its own contiguous output (slices of one
            # output would be strided, and copied by every reshape and kernel after them)
            parts = self._lib.quantized_matmul_split(x, self["weight"], self["scales"],
                                                     self.get("biases"), self.bits,
                                                     self.group_size, list(self._widths))
            if "bias" in self:
                parts = [p + b for p, b in zip(parts, self._biases())]
            stash = (x, parts, set(range(len(parts))))
            _plain(self, "_stash", stash)
        stash[2].discard(i)
        if not stash[2]:
            _plain(self, "_stash", None)  # all taken: keep no reference to this step's arrays
        return stash[1][i]

    def _biases(self):
        ends = [0]
        for width in self._widths:
            ends.append(ends[-1] + width)
        return [self["bias"][a:b] for a, b in zip(ends[:-1], ends[1:])]


class FusedMember(nn.Module):
    """Another member of a group: its columns of the first member's call."""

    def __init__(self, owner: FusedProjections, index: int):
        super().__init__()
        _plain(self, "_owner", owner)  # not a child module: its weights count once
        self._index = index

    def __call__(self, x):
        return self._owner.take(x, self._index)


def _plain(module, name: str, value) -> None:
    """An attribute mlx's Module keeps out of its parameter tree (it takes lists, tuples and
    modules in)."""
    object.__setattr__(module, name, value)


def _fusable(members) -> bool:
    first = members[0]
    return (all(type(m) is NativeQuantizedLinear for m in members)
            and len({(m.bits, m.group_size, m.mode) for m in members}) == 1
            and len({m["weight"].shape[1] for m in members}) == 1
            and len({m["weight"].dtype for m in members}) == 1
            and len({("biases" in m, m["scales"].dtype) for m in members}) == 1
            and len({"bias" in m for m in members}) == 1
            and first["scales"].ndim == 2)


def _fuse(parent, names: tuple[str, ...]) -> bool:
    members = [getattr(parent, n) for n in names]
    if not _fusable(members):
        return False
    first = members[0]
    owner = FusedProjections.__new__(FusedProjections)
    nn.Module.__init__(owner)
    owner.group_size, owner.bits, owner.mode = first.group_size, first.bits, first.mode
    for key in ("weight", "scales", "biases", "bias"):
        if key in first:
            owner[key] = mx.concatenate([m[key] for m in members], axis=0)
    rows = [m["scales"].shape[0] for m in members]
    _plain(owner, "_widths", tuple(rows))
    _plain(owner, "_stash", None)
    owner._lib = first._lib
    owner.freeze()
    setattr(parent, names[0], owner)
    for i, name in enumerate(names[1:], 1):
        setattr(parent, name, FusedMember(owner, i))
    # now, not with the whole model's: each group's separate weights are freed before the next
    # group is concatenated (all at once, a 1B's load peaked 220 MiB above the model)
    mx.eval(owner.parameters())
    return True


def _same_input(cls: type, names: tuple[str, ...]) -> bool:
    """Whether `cls.__call__`'s source calls each of `names` once, all on one plain name."""
    try:
        source = inspect.getsource(cls.__call__)
    except (OSError, TypeError):
        return False
    args = [re.findall(rf"self\.{n}\((\w+)\)", source) for n in names]
    return all(len(a) == 1 for a in args) and len({a[0] for a in args}) == 1


def fuse_projections(model) -> int:
    """Fuse every q/k/v and gate/up group of kernel layers in `model`; returns how many."""
    found = [(m, names) for _, m in model.named_modules() for names in GROUPS
             if all(isinstance(m.get(n), NativeQuantizedLinear) for n in names)
             and _same_input(type(m), names)]
    count = sum(_fuse(m, names) for m, names in found)  # not while walking the modules
    if count:
        mx.eval(model.parameters())
    return count
