"""Planning: which pending nodes to generate, in which order, and which may share a batch.

Knows dependencies (a pending node needs every pending node above it) and groups the work into
waves: wave w holds the pending nodes with exactly w pending ancestors, so no job depends on
another job of its own wave (fork siblings and separate conversations share a wave). Does not
run, sample or stream anything; the engine does, then calls `Tree.attach`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ContextOverflow, NodeStateError
from .nodes import GenSettings, Node
from .render import ReasoningFormat, RenderedPath, Tokenizer, render
from .toolformat import forced_call
from .tools import visible_tools

if TYPE_CHECKING:
    from .nodes import NodeLike
    from .tree import Tree

__all__ = ["Job", "plan"]


_status = operator.attrgetter("status")


@dataclass(slots=True)
class Job:
    """One node to generate.

    `gen` is the node's settings with default stops filled in (a reasoning node stops at the
    close tag). `prompt` is rendered when every node above is done (always so in wave 0, if
    `plan` got a tokenizer); otherwise None - render it with `render(tree, node_id, ...)` once
    `depends_on` are attached.
    """

    node_id: str
    kind: str
    wave: int
    gen: GenSettings
    depends_on: tuple[str, ...]
    prompt: RenderedPath | None = None


def _job_gen(kind: str, gen: GenSettings, fmt: ReasoningFormat, tree: Tree, node: Node,
             tokenizer: Tokenizer | None) -> GenSettings:
    if kind == "reasoning" and not gen.stop and fmt.close_tag:
        return gen.model_copy(update={"stop": (fmt.close_tag,)})
    if gen.forces_call and gen.constraint is None and tokenizer is not None:
        # the call format is the model's: known only now, from its chat template
        constraint = forced_call(visible_tools(tree.path(node)), gen.tool_choice,
                                 gen.parallel_tool_calls, getattr(tokenizer, "chat_template", None))
        return gen.model_copy(update={"constraint": constraint})
    return gen


def plan(
    tree: Tree,
    targets: Iterable[NodeLike] | None = None,
    tokenizer: Tokenizer | None = None,
    reasoning: ReasoningFormat | None = None,
    *,
    context_length: int | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[list[Job]]:
    """Waves of jobs computing every pending node that `targets` (default: all) depend on.

    A target may be any node; its pending ancestors (and itself, if pending) are planned.
    Failed nodes raise `NodeStateError` until `tree.reset()` (or removal): nothing computed is
    silently redone. With a tokenizer, wave-0 prompts are rendered and, given
    `context_length`, checked to fit prompt + max_tokens.
    """
    fmt = reasoning or ReasoningFormat()
    nodes = (
        list(tree) if targets is None else [tree[t] if isinstance(t, str) else t for t in targets]
    )
    wanted: set[str] = set()
    chain: list[Node] = []
    for target in nodes:
        path = tree.path(target)  # also checks the target belongs to this tree
        statuses = list(map(_status, path))  # (in C: a deep path's are mostly done)
        if "failed" in statuses:
            n = path[statuses.index("failed")]
            raise NodeStateError(
                f"node {n.id!r} failed ({n.error}); call tree.reset() on it "
                "to retry, or remove it.",
                n.id,
            )
        chain = list(itertools.compress(path, map("done".__ne__, statuses)))
        wanted.update(n.id for n in chain)
    if len(nodes) == 1:
        # One path: its order is the tree's (parents first), and a node's pending ancestors
        # are the pending nodes before it, so a deep tree is not walked (nor each path again).
        order = [(n, tuple(p.id for p in chain[:i])) for i, n in enumerate(chain)]
    else:  # parents first, so waves come out in tree order
        order = [(node, tuple(a.id for a in tree.ancestors(node) if a.is_pending))
                 for node in tree if node.id in wanted]
    waves: list[list[Job]] = []
    for node, deps in order:
        job = Job(node.id, node.kind, len(deps),
                  _job_gen(node.kind, node.gen, fmt, tree, node, tokenizer), deps)
        if not deps and tokenizer is not None:
            job.prompt = render(tree, node, tokenizer, fmt, template_kwargs=template_kwargs)
            need = job.prompt.num_tokens + job.gen.max_tokens
            if context_length is not None and need > context_length:
                raise ContextOverflow(
                    f"node {node.id!r} needs {need} tokens (prompt "
                    f"{job.prompt.num_tokens} + max_tokens "
                    f"{job.gen.max_tokens}) but the context holds "
                    f"{context_length}; lower max_tokens or prune the path.",
                    node.id,
                )
        while len(waves) <= job.wave:
            waves.append([])
        waves[job.wave].append(job)
    return waves
