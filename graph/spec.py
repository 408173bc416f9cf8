"""The declarative form: a whole workflow as data (pydantic; JSON, or YAML with PyYAML).

Knows `WorkflowSpec` (nodes with parent references, what to generate, forks, which branches to
keep), its file forms and its full validation before anything runs. `build()` and `advance()`
delegate to `expand`, which makes the tree. Does not run anything and does not know scorers
beyond their names: the runner passes them.

Ids: a spec node keeps its id in the tree, except under forks: branch i of fork node "r" is
"r.i", and a node "f" continuing under branch "r.i" is "f.i" (suffixes stack for nested
forks). Tree nodes built from a spec carry `meta["spec_id"]` (and `meta["branch"]` on fork
branches), so `advance` works on a saved and reloaded tree.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .checks import matches_model, spec_message
from .errors import SpecError
from .nodes import GENERATED_KINDS, GenSettings, ImagePart, Kind, Node
from .rules import check_parents, check_placement
from .tree import _ID, Tree

__all__ = ["ForkSpec", "KeepSpec", "NodeSpec", "Scorer", "WorkflowSpec", "branch_index",
           "matches_model"]

Scorer = Callable[[Node], float]


class KeepSpec(BaseModel):
    """Which fork branches continue: by index / branch id, or the `top` by a named scorer."""

    model_config = ConfigDict(extra="forbid")

    ids: list[int | str] | None = None
    scorer: str | None = None
    top: int = Field(1, ge=1)
    drop_others: bool = True


class ForkSpec(BaseModel):
    """k generated siblings: give `k`, `seeds` or `settings` (as `Tree.fork`)."""

    model_config = ConfigDict(extra="forbid")

    k: int | None = Field(None, ge=1)
    seeds: list[int] | None = None
    settings: list[GenSettings] | None = None
    keep: KeepSpec | None = None

    @property
    def num_branches(self) -> int:
        return len(self.settings or self.seeds or []) or self.k or 0


class NodeSpec(BaseModel):
    """One node (or, with `fork`, one set of sibling branches); `parent` is a spec id."""

    model_config = ConfigDict(extra="forbid")

    id: str
    parent: str | None = None
    kind: Kind
    text: str | None = None
    images: list[str | ImagePart] = []
    name: str | None = None
    gen: GenSettings | None = None
    fork: ForkSpec | None = None
    meta: dict[str, Any] = {}


class WorkflowSpec(BaseModel):
    """A workflow as data. `check()` validates fully; `build()` makes the tree."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["forkv.workflow"] = "forkv.workflow"
    version: Literal[1] = 1
    model_id: str | None = None
    nodes: list[NodeSpec] = []
    targets: list[str] = []

    # -- validation --------------------------------------------------------------------

    def check(self, scorers: Mapping[str, Scorer] | None = None) -> None:
        """Raise `SpecError` naming the first bad spec node; with `scorers`, check names too."""
        by_id: dict[str, NodeSpec] = {}
        for s in self.nodes:
            if not _ID.match(s.id):
                raise SpecError(
                    f"spec node id {s.id!r} is not valid; use 1-64 letters, digits, "
                    "'_', '.', ':' or '-'.",
                    s.id,
                )
            if s.id in by_id:
                raise SpecError(
                    f"spec node id {s.id!r} is used twice; give each node its own id.", s.id
                )
            by_id[s.id] = s
        check_parents({s.id: s.parent for s in self.nodes}, SpecError, SpecError)
        for s in self.nodes:
            parent = by_id[s.parent] if s.parent else None
            check_placement(
                s.kind,
                s.id,
                parent.kind if parent else None,
                s.parent,
                any(a.kind == "user" for a in self._ancestors(s, by_id)),
                SpecError,
            )
            self._check_content(s)
        for t in self.targets:
            if t not in by_id:
                raise SpecError(
                    f"target {t!r} is not a spec node; list ids of nodes in `nodes`.", t
                )
        seen: set[str] = set()
        for tree_id, s in self._all_ids(by_id):
            if tree_id in seen:
                raise SpecError(
                    f"spec node {s.id!r} expands to tree id {tree_id!r}, which "
                    "another node also gets; rename one of them.",
                    s.id,
                )
            seen.add(tree_id)
        if scorers is not None:
            for s in self.nodes:
                name = s.fork.keep.scorer if s.fork and s.fork.keep else None
                if name is not None and name not in scorers:
                    raise SpecError(
                        f"fork node {s.id!r} keeps branches by scorer {name!r}, "
                        "which was not given; pass it in scorers.",
                        s.id,
                    )

    @staticmethod
    def _ancestors(s: NodeSpec, by_id: dict[str, NodeSpec]) -> list[NodeSpec]:
        out = []
        while s.parent is not None:
            s = by_id[s.parent]
            out.append(s)
        return out

    @staticmethod
    def _check_content(s: NodeSpec) -> None:
        if s.kind not in GENERATED_KINDS:
            if s.gen is not None or s.fork is not None or s.text is None:
                raise SpecError(
                    f"{s.kind} node {s.id!r} needs text and no gen or fork; only "
                    "reasoning and final nodes are generated.",
                    s.id,
                )
        elif s.text is not None and (s.gen is not None or s.fork is not None):
            raise SpecError(
                f"{s.kind} node {s.id!r} has text and gen/fork; give text for a "
                "fixed turn or gen to generate it, not both.",
                s.id,
            )
        for image in s.images:
            if isinstance(image, str) and not Path(image).is_file():
                raise SpecError(
                    f"image {image!r} of node {s.id!r} is not a file; fix the path.", s.id
                )
        f = s.fork
        if f is None:
            return
        if f.seeds is not None and f.settings is not None:
            raise SpecError(f"fork node {s.id!r} gives both seeds and settings; give one.", s.id)
        n = len(f.seeds or f.settings or [])
        if (f.k is None and n == 0) or (f.k is not None and n and f.k != n):
            raise SpecError(
                f"fork node {s.id!r} needs k, seeds or settings that agree on the "
                "number of branches (at least 1).",
                s.id,
            )
        keep = f.keep
        if keep is None:
            return
        if (keep.ids is None) == (keep.scorer is None):
            raise SpecError(
                f"fork node {s.id!r} keep rule needs exactly one of ids or scorer.", s.id
            )
        if keep.top > f.num_branches:
            raise SpecError(
                f"fork node {s.id!r} keeps top {keep.top} of {f.num_branches} branches; lower top.",
                s.id,
            )
        for ref in keep.ids or []:
            if branch_index(s.id, ref) not in range(f.num_branches):
                raise SpecError(
                    f"fork node {s.id!r} keeps branch {ref!r}, which it does not "
                    f"make; use an index below {f.num_branches} or an id like "
                    f"{s.id + '.0'!r}.",
                    s.id,
                )

    def _all_ids(self, by_id: dict[str, NodeSpec]):
        """Every tree id the spec can produce (all branches continued), with its spec node."""
        kids = self._children()

        def walk(s: NodeSpec, sfx: str):
            if s.fork is None:
                yield s.id + sfx, s
                for c in kids.get(s.id, []):
                    yield from walk(c, sfx)
                return
            for i in range(s.fork.num_branches):
                yield f"{s.id}{sfx}.{i}", s
                for c in kids.get(s.id, []):
                    yield from walk(c, f"{sfx}.{i}")

        for root in kids.get(None, []):
            yield from walk(root, "")

    def _children(self) -> dict[str | None, list[NodeSpec]]:
        kids: dict[str | None, list[NodeSpec]] = {}
        for s in self.nodes:
            kids.setdefault(s.parent, []).append(s)
        return kids

    # -- building (see expand.py) -----------------------------------------------------

    def build(self) -> Tree:
        """Validate, then build the tree; nodes under a fork with a keep rule wait for
        `advance`."""
        from .expand import build_tree

        self.check()
        return build_tree(self)

    def advance(self, tree: Tree, scorers: Mapping[str, Scorer] | None = None) -> list[Node]:
        """Apply keep rules of forks whose branches are all done; return the nodes added.

        Kept branches get `meta["kept"] = True` and the fork's continuation; the others are
        removed if `drop_others`. Returns [] when nothing more can be added right now, so a
        runner loops: run pending nodes, `advance`, until it returns [].
        """
        from .expand import advance_tree

        return advance_tree(self, tree, scorers or {})

    # -- files -------------------------------------------------------------------------

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent, exclude_defaults=True)

    @classmethod
    def from_json(cls, data: str | bytes, source: str = "workflow spec") -> WorkflowSpec:
        """Parse and validate JSON; errors name `source` (a file name), the field and the fix."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as e:
            raise SpecError(spec_message(e, data, source, cls)) from None

    def to_yaml(self) -> str:
        return _yaml().safe_dump(
            self.model_dump(mode="json", exclude_defaults=True), sort_keys=False
        )

    @classmethod
    def from_yaml(cls, data: str, source: str = "workflow spec") -> WorkflowSpec:
        yaml = _yaml()
        try:
            obj = yaml.safe_load(data)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or type(e).__name__
            raise SpecError(f"{source} is not valid YAML{at} ({problem}); fix the YAML there.") \
                from None
        return cls.from_json(json.dumps(obj), source)

    def save(self, path: str | Path) -> None:
        """Write JSON, or YAML when the suffix is .yaml/.yml, readable by its owner only
        (0600): a spec holds prompts, and its results the generated text."""
        from forkv.security import write_private_file

        path = Path(path)
        yaml = path.suffix in (".yaml", ".yml")
        write_private_file(path, self.to_yaml() if yaml else self.to_json(indent=1))

    @classmethod
    def load(cls, path: str | Path) -> WorkflowSpec:
        """Read a .json, .yaml or .yml file; every error names the file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise SpecError(f"cannot read workflow spec {str(path)!r} ({why}); check the path.") \
                from None
        if path.suffix in (".yaml", ".yml"):
            return cls.from_yaml(text, str(path))
        return cls.from_json(text, str(path))


def branch_index(spec_id: str, ref: int | str) -> int:
    """Index of a fork branch given as an index or a branch id like 'r.2' (-1 if not one)."""
    if isinstance(ref, int):
        return ref
    head, _, last = ref.rpartition(".")
    return int(last) if last.isdigit() and head.startswith(spec_id) else -1


def _yaml():
    try:
        import yaml
    except ImportError as e:
        raise ImportError(
            "YAML specs need PyYAML: pip install pyyaml (JSON works without it)."
        ) from e
    return yaml
