"""The conversation tree: nodes under parents, and the operations agents use on them.

Knows structure (a networkx DiGraph kept private), building with validation at add time,
fork / prune / rewind / remove, results attached by the engine, and the token spans and block
keys a render recorded. Does not render, tokenize or run anything: see `render`, `plan` and
the engine. Building never triggers inference.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx

from . import serialize
from .branching import BranchingMixin
from .errors import (
    DuplicateNode,
    ForeignNode,
    GraphError,
    ModelMismatch,
    NodeNotFound,
    NodeRemoved,
)
from .nodes import GENERATED_KINDS, GenSettings, Node, NodeLike, make_image
from .render_cache import render_cache
from .results import ResultsMixin
from .rules import check_placement, validate_tree
from .tools import ToolCall, make_tools

if TYPE_CHECKING:
    from .spec import WorkflowSpec

__all__ = ["Tree"]

_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,63}$")
_PREFIX = {"system": "s", "user": "u", "reasoning": "r", "final": "f", "tool": "t"}


class Tree(BranchingMixin, ResultsMixin):
    """A forest of conversations; each root→leaf path renders to one token sequence.

    `fork` and `prune` come from `BranchingMixin`; results and renders are recorded through
    `ResultsMixin` (`attach`, `fail`, `reset`, `record_render`, `keys_only_in`). `model_id`
    names the model the tree was rendered for (set it, or let the engine set it);
    `check_model` refuses another. Iterating yields nodes parents-first.
    """

    def __init__(self, model_id: str | None = None):
        self.model_id = model_id
        self.block_size: int | None = None
        self._g = nx.DiGraph()
        self._removed: set[str] = set()
        self._next = 1

    # -- lookup ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def __iter__(self) -> Iterator[Node]:
        return (data["node"] for _, data in self._g.nodes(data=True))

    def __contains__(self, node: object) -> bool:
        node_id = node.id if isinstance(node, Node) else node
        return node_id in self._g and (not isinstance(node, Node) or node._tree is self)

    def __getitem__(self, node_id: str) -> Node:
        return self._resolve(node_id)

    def __repr__(self) -> str:
        return f"Tree(model_id={self.model_id!r}, num_nodes={len(self)})"

    def _resolve(self, node: NodeLike | None) -> Node:
        if isinstance(node, Node):
            if node._tree is not self:
                raise ForeignNode(
                    f"node {node.id!r} belongs to another tree; pass a node of "
                    "this tree (or its id).",
                    node.id,
                )
            node_id = node.id
        elif isinstance(node, str):
            node_id = node
        else:
            raise TypeError(f"expected a Node or a node id, got {type(node).__name__}")
        if node_id in self._removed:
            raise NodeRemoved(
                f"node {node_id!r} was removed from the tree; continue from a node "
                "that is still in it.",
                node_id,
            )
        if node_id not in self._g:
            raise NodeNotFound(
                f"node {node_id!r} is not in this tree; check the id or add the node first.",
                node_id,
            )
        return self._g.nodes[node_id]["node"]

    def _forget_signature(self, node_id: str) -> None:
        """A field that renders read was assigned on `node_id` (Node.__setattr__)."""
        render_cache(self).forget_signature(node_id)

    def _node_getter(self) -> Callable[[str], Node]:
        """`_resolve` for ids, faster where the id is in the tree (the same errors)."""
        nodes = self._g.nodes

        def get(node_id: str) -> Node:
            try:
                return nodes[node_id]["node"]
            except KeyError:
                return self._resolve(node_id)

        return get

    def newest_first(self) -> Iterator[Node]:
        """Nodes, the last added first (read as asked: a caller that stops early does not walk
        a big tree)."""
        nodes = self._g.nodes
        return (nodes[node_id]["node"] for node_id in reversed(list(self._g)))

    def roots(self) -> list[Node]:
        return [self._g.nodes[n]["node"] for n in self._g if self._g.in_degree(n) == 0]

    def parent(self, node: NodeLike) -> Node | None:
        node = self._resolve(node)
        return self._g.nodes[node.parent_id]["node"] if node.parent_id else None

    def children(self, node: NodeLike) -> list[Node]:
        node = self._resolve(node)
        return [self._g.nodes[c]["node"] for c in self._g.successors(node.id)]

    def ancestors(self, node: NodeLike) -> list[Node]:
        """Nodes above `node`, root first."""
        return self.path(node)[:-1]

    def path(self, node: NodeLike) -> list[Node]:
        """Nodes from the root down to `node`, inclusive."""
        node = self._resolve(node)
        nodes = self._g.nodes
        return render_cache(self).path(node, lambda n: nodes[n.parent_id]["node"])

    def descendants(self, node: NodeLike) -> list[Node]:
        """Nodes below `node`, parents first."""
        node = self._resolve(node)
        below = nx.descendants(self._g, node.id)
        return [n for n in self if n.id in below]

    def leaves(self) -> list[Node]:
        return [n for n in self if self._g.out_degree(n.id) == 0]

    def paths(self) -> list[list[Node]]:
        """Every root→leaf path."""
        return [self.path(leaf) for leaf in self.leaves()]

    def pending(self) -> list[Node]:
        return [n for n in self if n.is_pending]

    # -- building ----------------------------------------------------------------------

    def system(
        self, text: str, *, id: str | None = None, meta: dict[str, Any] | None = None,
        tools: Sequence[Any] = (),
    ) -> Node:
        """Start a conversation with a system prompt (and the `tools` it declares)."""
        return self.add(None, "system", text, id=id, meta=meta, tools=tools)

    def user(
        self,
        text: str,
        images: Sequence[Any] = (),
        *,
        id: str | None = None,
        meta: dict[str, Any] | None = None,
        tools: Sequence[Any] = (),
    ) -> Node:
        """Start a conversation with a user turn (no system prompt)."""
        return self.add(None, "user", text, images=images, id=id, meta=meta, tools=tools)

    def add(
        self,
        parent: NodeLike | None,
        kind: str,
        text: str | None = None,
        *,
        images: Sequence[Any] = (),
        gen: GenSettings | dict | None = None,
        id: str | None = None,
        name: str | None = None,
        meta: dict[str, Any] | None = None,
        copied_from: str | None = None,
        tools: Sequence[Any] = (),
        tool_calls: Sequence[Any] = (),
        tool_call_id: str | None = None,
    ) -> Node:
        """Add a node under `parent` (None for a root), validated before it joins the tree.

        Reasoning and final nodes are generated (`pending`) unless `text` is given; other kinds
        need `text`. `images` are paths, bytes or `ImagePart`s, hashed now. `tools` (functions,
        pydantic models, OpenAI tool dicts) are declared for the nodes below; `tool_calls`
        (`ToolCall`s or dicts) are the calls a given final turn made; `tool_call_id` the call a
        tool node answers.
        """
        parent_node = self._resolve(parent) if parent is not None else None
        node_id = self._new_id(kind, id)
        if kind not in _PREFIX:
            raise GraphError(
                f"node {node_id!r} has unknown kind {kind!r}; use one of {', '.join(_PREFIX)}.",
                node_id,
            )
        gen = GenSettings.of(gen, node_id)
        if kind in GENERATED_KINDS:
            if text is not None and gen is not None:
                raise GraphError(
                    f"{kind} node {node_id!r} has both text and gen settings; give "
                    "text for a fixed turn or gen to generate it, not both.",
                    node_id,
                )
            if text is None and gen is None:
                gen = GenSettings()
        else:
            if gen is not None:
                raise GraphError(
                    f"{kind} node {node_id!r} has gen settings, but only reasoning "
                    "and final nodes are generated; drop gen or change the kind.",
                    node_id,
                )
            if text is None:
                raise GraphError(
                    f"{kind} node {node_id!r} needs text; pass the text of the turn.", node_id
                )
        if images and kind not in ("user", "tool"):
            raise GraphError(
                f"{kind} node {node_id!r} has images, but only user and tool "
                "turns may carry images; move them to a user node.",
                node_id,
            )
        check_placement(
            kind,
            node_id,
            parent_node.kind if parent_node else None,
            parent_node.id if parent_node else None,
            parent_node is not None
            and (
                parent_node.kind == "user"
                or any(a.kind == "user" for a in self.ancestors(parent_node))
            ),
        )
        try:
            parts = [make_image(i) for i in images]
        except OSError as e:
            raise GraphError(
                f"image for node {node_id!r} cannot be read ({e}); check the path.", node_id
            ) from e
        node = Node(
            id=node_id,
            parent_id=parent_node.id if parent_node else None,
            kind=kind,
            text=text,
            images=parts,
            name=name,
            gen=gen,
            status="pending" if gen is not None else "done",
            copied_from=copied_from,
            tools=make_tools(tools),
            tool_calls=_tool_calls(node_id, kind, tool_calls),
            tool_call_id=tool_call_id,
            meta=dict(meta or {}),
        )
        self._insert(node)
        return node

    def _insert(self, node: Node) -> None:
        node._tree = self
        self._g.add_node(node.id, node=node)
        if node.parent_id is not None:
            self._g.add_edge(node.parent_id, node.id)

    def _new_id(self, kind: str, node_id: str | None) -> str:
        if node_id is None:
            while True:
                node_id = f"{_PREFIX.get(kind, 'n')}{self._next}"
                self._next += 1
                if node_id not in self._g and node_id not in self._removed:
                    return node_id
        if not isinstance(node_id, str) or not _ID.match(node_id):
            raise GraphError(
                f"node id {node_id!r} is not valid; use 1-64 letters, digits, "
                "'_', '.', ':' or '-'.",
                str(node_id),
            )
        if node_id in self._g or node_id in self._removed:
            raise DuplicateNode(
                f"node id {node_id!r} is already used in this tree; pick another id.", node_id
            )
        return node_id

    def rewind(self, node: NodeLike) -> Node:
        """Continue from an earlier `node`: return it; new children go under it, old ones stay."""
        return self._resolve(node)

    def remove(self, node: NodeLike) -> list[str]:
        """Delete `node` and its subtree; return the removed ids, parents first.

        Using a removed id later raises `NodeRemoved`. Call `keys_only_in(node)` first to learn
        which block keys only this subtree used, so the engine can release them.
        """
        node = self._resolve(node)
        ids = [node.id] + [n.id for n in self.descendants(node)]
        # removed Node objects keep pointing here, so using them raises NodeRemoved.
        self._g.remove_nodes_from(ids)
        self._removed.update(ids)
        render_cache(self).drop(ids)
        return ids

    # -- checks ------------------------------------------------------------------------

    def validate(
        self,
        context_length: int | None = None,
        count_tokens: Callable[[str], int] | None = None,
        tokenizer: Any = None,
        reasoning: Any = None,
    ) -> None:
        """Check every node's placement and, given `context_length`, that pending nodes fit.

        `count_tokens(node_id)` returns the prompt length of a pending node whose ancestors are
        done; with a `tokenizer` instead, `render` counts it.
        """
        if count_tokens is None and tokenizer is not None:
            from .render import ReasoningFormat, render

            fmt = reasoning or ReasoningFormat()

            def count_tokens(node_id: str) -> int:
                return len(render(self, node_id, tokenizer, fmt).token_ids)

        validate_tree(self, context_length, count_tokens)

    def check_model(self, model_id: str) -> None:
        """Raise `ModelMismatch` if the tree was rendered for a different model."""
        from .checks import matches_model

        if not matches_model(self.model_id, model_id):
            root = next(iter(self.roots()), None)
            raise ModelMismatch(
                f"this tree was rendered for model {self.model_id!r}, not "
                f"{model_id!r}; load it with that model, or start a new tree.",
                root.id if root else None,
            )

    # -- persistence -------------------------------------------------------------------

    def to_json(self, indent: int | None = None) -> str:
        return serialize.dump_tree(self, indent)

    @classmethod
    def from_json(cls, data: str | bytes | dict, model_id: str | None = None) -> Tree:
        """Rebuild a tree from `to_json` output (validated); with `model_id`, check the model."""
        tree = serialize.load_tree(cls, data)
        if model_id is not None:
            tree.check_model(model_id)
        return tree

    def save(self, path: str | Path, indent: int | None = 1) -> None:
        """Write the tree as JSON to a file only its owner can read (0600 from the start, also
        over an existing file): it holds the conversation's text. A symlink at `path` is
        refused (`forkv.security.write_private_file`)."""
        from forkv.security import write_private_file

        write_private_file(path, self.to_json(indent))

    @classmethod
    def load(cls, path: str | Path, model_id: str | None = None) -> Tree:
        return cls.from_json(Path(path).read_text(encoding="utf-8"), model_id)

    def to_spec(self, include_results: bool = True) -> WorkflowSpec:
        """This tree as a flat `WorkflowSpec`; done generated nodes keep their text if asked."""
        from .expand import tree_to_spec

        return tree_to_spec(self, include_results)


def _tool_calls(node_id: str, kind: str, calls: Sequence[Any]) -> list[ToolCall]:
    if calls and kind != "final":
        raise GraphError(f"{kind} node {node_id!r} has tool calls, but only final (assistant) "
                         "turns make them; move them to a final node.", node_id)
    return [c if isinstance(c, ToolCall) else ToolCall(**c) for c in calls]
