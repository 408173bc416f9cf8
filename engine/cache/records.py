"""Checkpoint records: copy one block's state out of live caches, and rebuild caches from them.

Per block and record kind, one record covers every leaf cache of that kind (engine/cache/kinds:
`global` K/V of the block, `window` K/V of the block's tail, `state` the whole state at the
boundary, ...); a leaf's arrays are named "<path>.<name>" (e.g. "3.k", "2.1.s0"). Rebuilt
caches have exactly the layout a fresh block-aligned prefill leaves behind, so the logits that
follow are bit-identical. Arrays are always copied: caches may update in place.
Knows nothing about keys, tiers or disks.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from . import kinds as _kinds
from .blocks import tokens_bytes
from .kinds.window import window_tail  # noqa: F401  (re-exported: tests and benches use it)
from .layout import CacheLayout, get_leaf, set_leaf

RECORD_VERSION = 1


@dataclass(slots=True)
class Record:
    kind: str  # record kind name (a CacheKind member or a kind's own name)
    block: int  # block index; the record describes the state at boundary (block+1)*B
    # The tokens and arrays are the conversation in another form: never in a repr or a log.
    tokens: bytes = field(repr=False)  # int32 LE: the block's tokens, or the whole prefix
    arrays: dict = field(default_factory=dict, repr=False)  # name -> mx.array
    # The namespace (tenant) tag of the run that made it (blocks.namespace_tag): a restore
    # takes a record only for a request of the same namespace, whatever its key.
    namespace: bytes = field(default=b"", repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + len(self.tokens)


def record_tokens(kind: str, tokens, pos: int, block_size: int) -> bytes:
    """The tokens a record of `kind` at boundary `pos` is verified against."""
    return tokens_bytes(tokens[:pos] if _kinds.whole_prefix(kind) else tokens[pos - block_size:pos])


def snapshot(caches: list, layout: CacheLayout, pos: int, block_size: int,
             tokens, kinds: Collection[str], namespace: bytes = b"") -> list[Record]:
    """Records of the given kinds for the block ending at `pos` (caches hold tokens[:pos])."""
    import mlx.core as mx

    assert pos % block_size == 0 and pos > 0
    block, out = pos // block_size - 1, []
    for kind in sorted(set(kinds) & layout.kinds):
        arrays = {}
        for leaf in layout.leaves(kind):
            cache = get_leaf(caches, leaf.path)
            for name, a in _kinds.kind_of(cache).snapshot(cache, pos, block_size).items():
                arrays[f"{leaf.label}.{name}"] = a
        out.append(Record(kind, block, record_tokens(kind, tokens, pos, block_size), arrays,
                          namespace))
    mx.eval([r.arrays for r in out])
    return out


def window_blocks(layout: CacheLayout, n: int, block_size: int) -> range:
    """Blocks whose window records a restore at boundary n needs."""
    return layout.blocks("window", n, block_size)


def by_leaf(records: dict[int, Record]) -> dict[str, dict[int, dict]]:
    """leaf label -> block -> that leaf's arrays (names without the label), in one pass."""
    out: dict[str, dict[int, dict]] = {}
    for block, record in records.items():
        for name, a in record.arrays.items():
            parts = name.split(".")
            cut = next((i for i, p in enumerate(parts) if not p.isdigit()), len(parts))
            # the label is the leading integers (a kind's own names never start with a digit)
            label, sub = ".".join(parts[:cut]), ".".join(parts[cut:])
            out.setdefault(label, {}).setdefault(block, {})[sub] = a
    return out


def rebuild(fresh: list, layout: CacheLayout, n: int, block_size: int,
            records: dict[str, dict[int, Record]], kinds: Collection[str] | None = None) -> list:
    """Fill `fresh` (from model.make_cache()) so its leaves of `kinds` (default: all) hold
    boundary n, from `records[kind][block]` (the blocks `layout.blocks(kind, n, B)` lists)."""
    import mlx.core as mx

    if n == 0:
        return fresh
    split = {kind: by_leaf(got) for kind, got in records.items()}
    for leaf in layout.layers:
        if kinds is not None and leaf.kind not in kinds:
            continue
        cache = get_leaf(fresh, leaf.path)
        arrays = split[leaf.kind].get(leaf.label, {})
        set_leaf(fresh, leaf.path, _kinds.kind_of(cache).rebuild(cache, n, block_size, arrays))
    mx.eval([c.state for c in fresh])
    return fresh
