"""Saving and loading trees as JSON.

Knows the file layout (`format`, `version`, `model_id`, `block_size`, nodes parents-first,
removed ids) and how to rebuild and re-validate a tree from it. Does not know specs (see
`spec`) or any model: the model id is only compared, never resolved.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import CycleError, NodeNotFound, TreeFormatError
from .nodes import Node
from .rules import check_parents, validate_tree

if TYPE_CHECKING:
    from .tree import Tree

__all__ = ["FORMAT", "VERSION", "dump_tree", "load_tree"]

FORMAT = "forkv.tree"
VERSION = 1


class _TreeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["forkv.tree"] = FORMAT
    version: int = VERSION
    model_id: str | None = None
    block_size: int | None = None
    next_id: int = 1
    nodes: list[Node] = []
    removed: list[str] = []


def dump_tree(tree: Tree, indent: int | None = None) -> str:
    doc = _TreeFile(
        model_id=tree.model_id,
        block_size=tree.block_size,
        next_id=tree._next,
        nodes=list(tree),
        removed=sorted(tree._removed),
    )
    return doc.model_dump_json(indent=indent, exclude_defaults=False)


def load_tree(cls: type[Tree], data: str | bytes | dict) -> Tree:
    if isinstance(data, dict):
        data = json.dumps(data)  # through JSON so image bytes decode from base64
    try:
        head = json.loads(data)
    except json.JSONDecodeError as e:
        raise TreeFormatError(
            f"tree file is not JSON ({e}); pass the output of Tree.to_json() or Tree.save()."
        ) from e
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise TreeFormatError(
            "tree file lacks format 'forkv.tree'; pass the output of Tree.to_json() or Tree.save()."
        )
    if not isinstance(head.get("version"), int) or head["version"] > VERSION:
        raise TreeFormatError(
            f"tree file has format version {head.get('version')!r} but this "
            f"forkv reads up to {VERSION}; upgrade forkv to load it."
        )
    try:
        doc = _TreeFile.model_validate_json(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = err["loc"]
        node_id = None
        if len(loc) > 1 and loc[0] == "nodes" and isinstance(loc[1], int):
            node_id = (
                head["nodes"][loc[1]].get("id") if isinstance(head["nodes"][loc[1]], dict) else None
            )
        where = f"node {node_id!r}" if node_id else "the tree file"
        raise TreeFormatError(
            f"{where} is malformed at {'.'.join(map(str, loc))} "
            f"({err['msg']}); fix or regenerate the file.",
            node_id,
        ) from e
    by_id: dict[str, Node] = {}
    for node in doc.nodes:
        if node.id in by_id:
            raise TreeFormatError(
                f"node {node.id!r} appears twice in the tree file; keep one.", node.id
            )
        by_id[node.id] = node
        if node.status != "done" and node.gen is None:
            raise TreeFormatError(
                f"node {node.id!r} is {node.status} but has no gen settings; fix the file.", node.id
            )
    order = check_parents({n.id: n.parent_id for n in doc.nodes}, CycleError, NodeNotFound)
    tree = cls(model_id=doc.model_id)
    tree.block_size = doc.block_size
    tree._removed = set(doc.removed)
    tree._next = max(doc.next_id, 1)
    for node_id in order:
        tree._insert(by_id[node_id])
    validate_tree(tree)
    return tree
