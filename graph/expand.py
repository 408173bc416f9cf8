"""Expanding a `WorkflowSpec` into a `Tree`: forks, branch ids, keep rules.

Knows how spec nodes become tree nodes (ids with branch suffixes, `meta["spec_id"]` and
`meta["branch"]` markers) and how a keep rule selects, marks and drops fork branches, then
continues under the kept ones. Does not validate specs (`WorkflowSpec.check` does, first) and
does not run or score anything itself: scorers are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import SpecError
from .nodes import Node
from .spec import NodeSpec, Scorer, WorkflowSpec, branch_index
from .tree import Tree

__all__ = ["advance_tree", "build_tree", "tree_to_spec"]

Kids = dict[str | None, list[NodeSpec]]


def build_tree(spec: WorkflowSpec) -> Tree:
    """The tree of a checked spec; continuations of keep-rule forks wait for `advance_tree`."""
    tree = Tree(model_id=spec.model_id)
    kids = _children(spec)
    for root in kids.get(None, []):
        _expand(tree, kids, root, None, "")
    return tree


def _children(spec: WorkflowSpec) -> Kids:
    kids: Kids = {}
    for s in spec.nodes:
        kids.setdefault(s.parent, []).append(s)
    return kids


def _expand(tree: Tree, kids: Kids, s: NodeSpec, parent: Node | None, sfx: str) -> list[Node]:
    meta = {**s.meta, "spec_id": s.id}
    if s.fork is None:
        node = tree.add(
            parent,
            s.kind,
            s.text,
            images=s.images,
            gen=s.gen,
            id=s.id + sfx,
            name=s.name,
            meta=meta,
        )
        return [node] + [n for c in kids.get(s.id, []) for n in _expand(tree, kids, c, node, sfx)]
    f = s.fork
    n = f.num_branches
    branches = tree.fork(
        parent,
        None if (f.seeds or f.settings) else n,
        s.kind,
        seeds=f.seeds,
        settings=f.settings,
        gen=s.gen,
        ids=[f"{s.id}{sfx}.{i}" for i in range(n)],
    )
    for i, b in enumerate(branches):
        b.meta.update(meta, branch=i)
    out = list(branches)
    if f.keep is None:  # no selection: every branch continues
        for i, b in enumerate(branches):
            out += [x for c in kids.get(s.id, []) for x in _expand(tree, kids, c, b, f"{sfx}.{i}")]
    return out


def advance_tree(spec: WorkflowSpec, tree: Tree, scorers: Mapping[str, Scorer]) -> list[Node]:
    """Apply ready keep rules (all branches done, not yet applied); return the nodes added."""
    kids = _children(spec)
    added: list[Node] = []
    for s in spec.nodes:
        if s.fork is None or s.fork.keep is None:
            continue
        groups: dict[str | None, list[Node]] = {}  # one group per fork instance (parent)
        for n in tree:
            if n.meta.get("spec_id") == s.id and "branch" in n.meta:
                groups.setdefault(n.parent_id, []).append(n)
        for branches in groups.values():
            if any(b.is_pending for b in branches) or any("kept" in b.meta for b in branches):
                continue
            kept_ids = {b.id for b in _select(s, branches, scorers)}
            for b in branches:
                b.meta["kept"] = b.id in kept_ids
                if b.id not in kept_ids and s.fork.keep.drop_others:
                    tree.remove(b)
            for b in branches:
                if b.id in kept_ids:  # children take the branch's suffix, e.g. "f" -> "f.2"
                    added += [
                        x
                        for c in kids.get(s.id, [])
                        for x in _expand(tree, kids, c, b, b.id[len(s.id) :])
                    ]
    return added


def _select(s: NodeSpec, branches: list[Node], scorers: Mapping[str, Scorer]) -> list[Node]:
    keep = s.fork.keep
    if keep.ids is not None:
        wanted = {branch_index(s.id, ref) for ref in keep.ids}
        return [b for b in branches if b.meta["branch"] in wanted]
    if keep.scorer not in scorers:
        raise SpecError(
            f"fork node {s.id!r} keeps branches by scorer {keep.scorer!r}, which "
            "was not given; pass it in scorers.",
            s.id,
        )
    score = scorers[keep.scorer]
    ranked = sorted(branches, key=lambda b: (-score(b), b.meta["branch"]))  # ties: by index
    return ranked[: keep.top]


def tree_to_spec(tree: Tree, include_results: bool = True) -> WorkflowSpec:
    """A flat spec (one NodeSpec per node, no forks) that rebuilds `tree`'s structure.

    Done generated nodes become fixed text when `include_results`, else are generated again.
    Token ids, stats and spans are not part of a spec: use `Tree.save` to keep those.
    """
    nodes = []
    for n in tree:
        fixed = n.gen is None or (include_results and n.status == "done")
        nodes.append(
            NodeSpec(
                id=n.id,
                parent=n.parent_id,
                kind=n.kind,
                text=n.text if fixed else None,
                images=list(n.images),
                name=n.name,
                gen=None if fixed else n.gen,
                meta=dict(n.meta),
            )
        )
    return WorkflowSpec(model_id=tree.model_id, nodes=nodes)
