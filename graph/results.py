"""What the engine writes into a tree: results, failures, rendered spans and block keys.

Knows how a generated node moves between pending, done and failed, and how a `RenderedPath`'s
spans and the engine's block keys are stored on nodes. Mixed into `Tree`; does not know how
results are computed or how keys are derived (the engine's business).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from .errors import NodeStateError
from .nodes import BlockRef, Node, NodeResult, NodeStats
from .render import block_range
from .render_cache import common_prefix, render_cache

if TYPE_CHECKING:
    from .render import RenderedPath
    from .nodes import NodeLike

__all__ = ["ResultsMixin"]


class ResultsMixin:
    """`attach`, `fail`, `reset`, `record_render` and `keys_only_in`, mixed into `Tree`."""

    def attach(
        self,
        node: NodeLike,
        text: str,
        token_ids: Sequence[int] = (),
        finish_reason: str | None = None,
        timings: dict[str, float] | None = None,
        stats: NodeStats | dict | None = None,
    ) -> Node:
        """Record a generated node's result (text without the stop string) and mark it done."""
        node = self._resolve(node)
        if node.gen is None or node.status == "done":
            raise NodeStateError(
                f"node {node.id!r} is not waiting for a result; call "
                "tree.reset() on it first, or attach to a pending node.",
                node.id,
            )
        node.text = text
        node.result = NodeResult(
            text=text,
            token_ids=list(token_ids),
            finish_reason=finish_reason,
            timings=dict(timings or {}),
            stats=NodeStats(**stats) if isinstance(stats, dict) else stats or NodeStats(),
        )
        node.status, node.error = "done", None
        return node

    def fail(self, node: NodeLike, error: str) -> Node:
        """Mark a pending node failed with a message; `plan` refuses it until `reset`."""
        node = self._resolve(node)
        if node.gen is None:
            raise NodeStateError(
                f"node {node.id!r} is not generated, so it cannot fail; only "
                "reasoning and final nodes with gen settings run.",
                node.id,
            )
        node.status, node.error = "failed", str(error)
        return node

    def reset(self, node: NodeLike) -> Node:
        """Make a generated node pending again, clearing its result (no done children allowed)."""
        node = self._resolve(node)
        if node.gen is None:
            raise NodeStateError(
                f"node {node.id!r} has given text and nothing to redo; edit a copy instead.",
                node.id,
            )
        for d in self.descendants(node):
            if d.gen is not None and d.status == "done":
                raise NodeStateError(
                    f"node {node.id!r} has done descendant {d.id!r} built on "
                    "its text; remove that subtree before resetting.",
                    node.id,
                )
        node.status, node.text, node.result, node.error = "pending", None, None, None
        node.span, node.blocks, node.turn_keys = None, [], []
        render_cache(self).record = None  # the next record_render writes every node again
        return node

    def record_render(
        self,
        rendered: RenderedPath,
        block_keys: Sequence[str] = (),
        block_size: int = 256,
        turn_keys: Mapping[int, str] | None = None,
    ) -> None:
        """Store each path node's span and covering blocks (with keys where given) from a render.

        `block_keys[i]` is the engine's hex key of full block i of `rendered.token_ids`;
        `turn_keys` maps a token position to the hex key of the engine's checkpoint there (a
        turn end), added to the node whose span holds the token before it (or the last node
        starting before it).
        """
        self.block_size = block_size
        cache = render_cache(self)
        last, cache.record = cache.record, None  # (stale if this call stops half way)
        items = list(rendered.spans.items())
        keys = list(block_keys)
        turns = sorted((turn_keys or {}).items())
        spans = rendered.spans
        starts = sorted(zip(map(_first, spans.values()), spans))  # (start, id), built in C
        skip, skip_turns = _recorded(last, items, keys, block_size, turns, starts)
        num_keys = len(keys)
        get = self._node_getter()
        for node_id, span in items[skip:]:
            node = get(node_id)
            if node.span != span:
                node.span = span
            blocks = node.blocks
            rng = block_range(span, block_size)
            same = len(blocks) == len(rng)  # most are as the last render
            for b, i in zip(blocks, rng) if same else ():
                if b.index != i or b.key != (keys[i] if i < num_keys else None):
                    same = False
                    break
            if not same:
                node.blocks = [BlockRef(index=i, key=keys[i] if i < num_keys else None)
                               for i in rng]
        # Turn keys accumulate: a later render of the path may place a node's tokens
        # differently, and the checkpoints of the earlier one stay in the store until released.
        firsts = list(map(_first, starts))
        for pos, key in turns[skip_turns:]:
            i = bisect_left(firsts, pos)  # the last node starting before pos owns it
            node = get(starts[i - 1][1]) if i else None
            if node is not None and key not in node.turn_keys:
                node.turn_keys.append(key)
        cache.record = _Record(items, keys, block_size, turns, starts)

    def keys_only_in(self, node: NodeLike) -> set[str]:
        """Checkpoint keys (blocks and turn ends) used by `node`'s subtree and by no other
        node (safe to release)."""
        node = self._resolve(node)
        inside = {node.id} | {n.id for n in self.descendants(node)}
        mine = set().union(*(_keys(self[n]) for n in inside))
        return mine - set().union(*(_keys(n) for n in self if n.id not in inside))


@dataclass(frozen=True, slots=True)
class _Record:
    """What the last `record_render` of a tree wrote: the next one skips what it repeats."""

    items: list[tuple[str, tuple[int, int]]]
    keys: list[str]
    block_size: int
    turns: list[tuple[int, str]]
    starts: list[tuple[int, str]]


def _recorded(last: _Record | None, items: list, keys: list[str], block_size: int,
              turns: list, starts: list) -> tuple[int, int]:
    """(how many first nodes of `items`, how many first turn keys of `turns`) the last record
    already wrote as this one would: a deep path's next turn touches only its last nodes.

    A node is skipped when it and every node before it have the same id and span as last
    time, and its blocks' keys are among the keys both records share; a turn key when it and
    every one before it are as last time and its owner lies among the nodes before the first
    start the two records do not share (so ownership is decided alike)."""
    if last is None or last.block_size != block_size:
        return 0, 0
    same = common_prefix(last.items, items)
    limit = common_prefix(last.keys, keys) * block_size  # blocks up to here keep their keys
    # spans' ends ascend along the path: the first `same` that end by `limit`, by bisection
    skip = bisect_right(items, limit, hi=same, key=_span_end)
    shared_starts = common_prefix(last.starts, starts)
    if not shared_starts:
        return skip, 0
    bound = starts[shared_starts - 1][0]
    shared_turns = common_prefix(last.turns, turns)
    return skip, bisect_right(turns, bound, hi=shared_turns, key=_first)


_first = itemgetter(0)  # a span's start; a (start, id) or (position, key) pair's first


def _span_end(item: tuple[str, tuple[int, int]]) -> int:
    return item[1][1]


def _keys(node: Node) -> set[str]:
    return {b.key for b in node.blocks if b.key} | set(node.turn_keys)
