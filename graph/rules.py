"""Which kind of node may sit under which, and whole-tree validation.

Knows the placement rules (a chat alternates user and assistant turns; reasoning belongs to an
assistant turn), cycle detection over raw parent references, and the context-length check.
Works on kinds and ids only, so specs and saved trees are checked by the same code as the
builder. Does not render anything: token counts come from a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import networkx as nx

from .errors import ContextOverflow, CycleError, InvalidPlacement, NodeNotFound

if TYPE_CHECKING:
    from .tree import Tree

__all__ = ["check_parents", "check_placement", "validate_tree"]

# parent kind -> kinds allowed directly under it (None = root)
_ALLOWED: dict[str | None, frozenset[str]] = {
    None: frozenset({"system", "user"}),
    "system": frozenset({"user"}),
    "user": frozenset({"reasoning", "final"}),
    "reasoning": frozenset({"final"}),
    "final": frozenset({"user", "tool"}),
    "tool": frozenset({"reasoning", "final", "tool"}),
}


def check_placement(
    kind: str,
    node_id: str,
    parent_kind: str | None,
    parent_id: str | None,
    has_user_above: bool,
    error: type[Exception] = InvalidPlacement,
) -> None:
    """Raise `error` naming `node_id` if a `kind` node may not sit under its parent."""
    if kind in _ALLOWED.get(parent_kind, frozenset()):
        if kind == "final" and not has_user_above:  # unreachable by the table; kept as a guard
            raise error(
                f"final node {node_id!r} has no user turn above it; add a user node first.", node_id
            )
        return
    under = f"{parent_kind} node {parent_id!r}" if parent_kind else "nothing (it is a root)"
    if kind == "system":
        msg = (
            f"system node {node_id!r} sits under {under}; a system prompt must be a root, "
            "so start a new conversation with tree.system()."
        )
    elif kind == "final" and parent_kind in (None, "system"):
        msg = f"final node {node_id!r} has no user turn above it; add a user node first."
    elif kind == "reasoning" and parent_kind in (None, "system"):
        msg = (
            f"reasoning node {node_id!r} sits directly under {under}; add a user node between them."
        )
    elif kind == "user" and parent_kind == "reasoning":
        msg = (
            f"user node {node_id!r} follows reasoning node {parent_id!r} without a final "
            "answer; add a final node under it first, or prune the reasoning."
        )
    elif kind == "tool":
        msg = (
            f"tool node {node_id!r} sits under {under}; a tool result must follow the final "
            "(assistant) node that called the tool."
        )
    elif (
        kind in ("user", "final", "reasoning")
        and parent_kind == kind
        or (kind == "reasoning" and parent_kind == "final")
    ):
        msg = (
            f"{kind} node {node_id!r} sits directly under {under}; turns must alternate, so "
            "add a user turn between them or attach it to an earlier node."
        )
    else:
        allowed = sorted(k for k, v in _ALLOWED.items() if k and kind in v)
        msg = (
            f"{kind} node {node_id!r} may not sit under {under}; attach it under a "
            f"{' or '.join(allowed) or 'root'} node."
        )
    raise error(msg, node_id)


def check_parents(
    parents: Mapping[str, str | None],
    error: type[Exception] = CycleError,
    missing: type[Exception] = NodeNotFound,
) -> list[str]:
    """Check raw `id -> parent id` references; return ids in parents-first order.

    Raises `missing` for a parent id that is not in the mapping and `error` for a cycle,
    each naming a node.
    """
    g = nx.DiGraph()
    g.add_nodes_from(parents)
    for node_id, parent_id in parents.items():
        if parent_id is None:
            continue
        if parent_id not in parents:
            raise missing(
                f"node {node_id!r} names parent {parent_id!r}, which does not exist; "
                "fix the parent reference or add that node.",
                node_id,
            )
        g.add_edge(parent_id, node_id)
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        order = {node_id: i for i, node_id in enumerate(parents)}  # keep the given order
        return list(nx.lexicographical_topological_sort(g, key=order.__getitem__))
    node_id = cycle[0][0]
    ring = " -> ".join([e[0] for e in cycle] + [node_id])
    raise error(
        f"node {node_id!r} is its own ancestor ({ring}); break the cycle by fixing a "
        "parent reference.",
        node_id,
    )


def validate_tree(
    tree: Tree,
    context_length: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    nodes: Iterable[str] | None = None,
) -> None:
    """Check placement of every node and, given `context_length`, that pending nodes fit.

    For a pending node n, let p be the highest pending node on its path (everything above p is
    done, so p's prompt can be rendered). The need is `count_tokens(p.id)` plus the
    `max_tokens` of every pending node from p down to n; it must not exceed `context_length`.
    Without `count_tokens` only the `max_tokens` sum is checked.
    """
    ids = list(nodes) if nodes is not None else [n.id for n in tree]
    for node_id in ids:
        node = tree[node_id]
        parent = tree.parent(node)
        has_user = any(a.kind == "user" for a in tree.ancestors(node))
        check_placement(
            node.kind,
            node.id,
            parent.kind if parent else None,
            parent.id if parent else None,
            has_user,
        )
    if context_length is None:
        return
    prompt_cache: dict[str, int] = {}
    for node_id in ids:
        node = tree[node_id]
        if not node.is_pending or node.gen is None:
            continue
        pending = [n for n in tree.path(node) if n.is_pending and n.gen is not None]
        head = pending[0]
        if head.id not in prompt_cache:
            prompt_cache[head.id] = count_tokens(head.id) if count_tokens else 0
        need = prompt_cache[head.id] + sum(n.gen.max_tokens for n in pending)
        if need > context_length:
            raise ContextOverflow(
                f"node {node.id!r} may need {need} tokens (prompt {prompt_cache[head.id]} + "
                f"max_tokens along its pending path) but the context holds {context_length}; "
                "lower max_tokens or prune the path.",
                node.id,
            )
