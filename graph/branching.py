"""Branching a tree: fork k siblings, and prune a path into a new branch.

Knows how fork settings fan out (seeds or per-branch settings) and how a prune rebuilds a path
without some ancestors, copying the kept nodes below the cut verbatim. Mixed into `Tree`; uses
the tree's lookup and `add`, plus the placement rules. Does not compute anything.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forkv.errors import ForkvWarning

from .errors import GraphError, NodeStateError
from .nodes import GENERATED_KINDS, GenSettings, Node
from .rules import check_placement

if TYPE_CHECKING:
    from .nodes import NodeLike

__all__ = ["FORK_TEMPERATURE", "BranchingMixin"]

# What seeded fork branches sample at unless their settings say otherwise: greedy branches
# would all be the same text, whatever their seeds.
FORK_TEMPERATURE = 0.7


class BranchingMixin:
    """`fork` and `prune`, mixed into `Tree`."""

    def fork(
        self,
        node: NodeLike,
        k: int | None = None,
        kind: str = "reasoning",
        *,
        seeds: Sequence[int] | None = None,
        settings: Sequence[GenSettings | dict] | None = None,
        gen: GenSettings | dict | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[Node]:
        """Add k generated `kind` siblings under `node`, differing in seed or settings.

        Give `seeds` (each applied to `gen`), or `settings` (one per child), or just `k`: then
        seeds are `gen.seed + i` (or `i` when `gen.seed` is None). Branches are meant to
        differ: when `gen` does not set a temperature, seeded branches sample at
        `FORK_TEMPERATURE` (0.7); branches that would still be identical (an explicit
        temperature 0, or equal settings) raise a `ForkvWarning`.
        """
        node = self._resolve(node)
        if kind not in GENERATED_KINDS:
            raise GraphError(
                f"cannot fork {kind} children under node {node.id!r}; only "
                "reasoning and final nodes are generated.",
                node.id,
            )
        base = GenSettings.of(gen, node.id) or GenSettings()
        if settings is not None:
            gens = [GenSettings.of(s, node.id) for s in settings]
        else:
            if seeds is None:
                if k is None:
                    raise GraphError(
                        f"fork under node {node.id!r} needs k, seeds or settings; "
                        "say how many branches to make.",
                        node.id,
                    )
                start = base.seed if base.seed is not None else 0
                seeds = [start + i for i in range(k)]
            if "temperature" not in base.model_fields_set and len(set(seeds)) > 1:
                base = base.model_copy(update={"temperature": FORK_TEMPERATURE})
            gens = [base.model_copy(update={"seed": s}) for s in seeds]
        if k is not None and k != len(gens) or not gens:
            raise GraphError(
                f"fork under node {node.id!r} asks for k={k} but gets {len(gens)} "
                "seeds/settings; make them agree (k >= 1).",
                node.id,
            )
        if ids is not None and len(ids) != len(gens):
            raise GraphError(
                f"fork under node {node.id!r} got {len(ids)} ids for {len(gens)} "
                "branches; give one id per branch.",
                node.id,
            )
        _warn_if_alike(node.id, gens)
        return [self.add(node, kind, gen=g, id=ids[i] if ids else None) for i, g in enumerate(gens)]

    def prune(self, node: NodeLike, drop: Sequence[NodeLike] | None = None) -> Node:
        """Continue from `node` with the `drop` ancestors left out; return the new `node`.

        The path root→node minus `drop` is rebuilt: nodes above the first dropped one are
        shared, nodes below it are copied (text verbatim, status done, `copied_from` set) under
        the last shared node. The seed case `prune(final, drop=[reasoning])` turns
        system → user → reasoning → final into system → user → final'; add the follow-up under
        final'. `drop=None` drops the reasoning nodes between `node` and its user turn. Pruning
        twice reuses the copies made the first time.
        """
        node = self._resolve(node)
        path = self.path(node)
        if drop is None:
            drop_ids = set()
            for n in reversed(path[:-1]):
                if n.kind != "reasoning":
                    break
                drop_ids.add(n.id)
        else:
            drop_ids = {self._resolve(d).id for d in drop}
        on_path = {n.id for n in path[:-1]}
        for d in sorted(drop_ids - on_path):
            raise GraphError(
                f"node {d!r} is not above node {node.id!r}; prune can only drop "
                f"ancestors of the node it continues from.",
                d,
            )
        if not drop_ids:
            return node
        first = next(i for i, n in enumerate(path) if n.id in drop_ids)
        anchor = path[first - 1] if first else None
        kept = [n for n in path[first:] if n.id not in drop_ids]
        has_user = any(n.kind == "user" for n in path[:first])
        prev_kind, prev_id = (anchor.kind, anchor.id) if anchor else (None, None)
        for n in kept:  # check the whole new chain before adding anything
            if n.is_pending:
                raise NodeStateError(
                    f"node {n.id!r} has no text yet; run it before pruning, or drop it too.", n.id
                )
            check_placement(n.kind, n.id, prev_kind, prev_id, has_user)
            has_user = has_user or n.kind == "user"
            prev_kind, prev_id = n.kind, n.id
        parent = anchor
        for n in kept:
            siblings = self.children(parent) if parent else self.roots()
            same = [
                c
                for c in siblings
                if c.copied_from == n.id and c.kind == n.kind and c.text == n.text
            ]
            parent = (
                same[0]
                if same
                else self.add(
                    parent,
                    n.kind,
                    n.text,
                    images=n.images,
                    name=n.name,
                    meta=n.meta,
                    copied_from=n.id,
                    tools=n.tools,
                    tool_calls=n.tool_calls,
                    tool_call_id=n.tool_call_id,
                )
            )
        return parent


def _warn_if_alike(node_id: str, gens: list[GenSettings]) -> None:
    """Warn when two branches must generate the same text: same settings, and either greedy
    (seeds do not matter then) or the same seed."""
    seen = set()
    for g in gens:
        key = g.model_copy(update={"seed": None}) if g.temperature == 0 else g
        if key in seen:
            warnings.warn(
                f"fork under node {node_id!r} makes branches that will be identical "
                f"({'temperature 0' if g.temperature == 0 else 'same seed and settings'}); "
                "set a temperature > 0 and distinct seeds so they differ.",
                ForkvWarning, stacklevel=4)
            return
        seen.add(key)
