"""The tool-using agent loop: ask for a turn, run the tools it calls, continue, up to N steps -
on one branch or on several at once.

`run_agents` advances every live branch one step per `session.run` (so the branches share a
batch), attaches each step's tool calls, runs them through the tools' Python functions (or
`handlers`) and adds the results as `tool` nodes; a branch ends when a step calls no tool or
after `max_steps`. `fork_agents` starts k branches under one node with different seeds, so
agent code can score them and keep one (`Session.remove` releases the others). Every step
reports how many prompt tokens came from checkpoints (`tokens_reused`) and how many had to
be computed: a step's prompt is the previous step's plus a tool result, so nearly all of it
is reused. Uses the Session only through `run`, `tree` and the node builders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from forkv.graph import GenSettings, Node

from .tools import attach_tool_calls, run_tools

__all__ = ["AgentResult", "AgentStep", "fork_agents", "run_agent", "run_agents"]

ToolChoice = str | Sequence[str]


@dataclass(slots=True)
class AgentStep:
    """One turn of a branch: the final node generated, the tool nodes its calls produced, and
    where its prompt tokens came from."""

    node: Node
    results: list[Node]
    tokens_reused: int
    tokens_computed: int
    tokens_generated: int

    @property
    def calls(self) -> list:
        return list(self.node.tool_calls)


@dataclass(slots=True)
class AgentResult:
    """A branch's steps, in order; `last` is its last final node (the answer if it called no
    tool)."""

    steps: list[AgentStep] = field(default_factory=list)

    @property
    def last(self) -> Node:
        return self.steps[-1].node

    @property
    def tokens_reused(self) -> int:
        return sum(s.tokens_reused for s in self.steps)

    @property
    def tokens_computed(self) -> int:
        return sum(s.tokens_computed for s in self.steps)


def _choice(tool_choice: ToolChoice, step: int) -> str:
    """A step's tool_choice: a string for every step, or one per step (the last repeats)."""
    if isinstance(tool_choice, str):
        return tool_choice
    return tool_choice[min(step, len(tool_choice) - 1)]


def _gen(base: GenSettings, choice: str, seed: int | None) -> GenSettings:
    return base.model_copy(update={"tool_choice": choice, "seed": seed})


def run_agents(session: Any, starts: Sequence[Node], *, max_steps: int = 4,
               gen: GenSettings | dict | None = None, tool_choice: ToolChoice = "auto",
               handlers: dict[str, Callable[..., Any]] | None = None,
               first: Sequence[Node] | None = None) -> list[AgentResult]:
    """Run the loop on each branch starting under `starts` (user or tool nodes), all branches
    stepping together. `tool_choice` applies to every step or gives one per step (e.g.
    `["required", "none"]`: call a tool, then answer). `first` are pending final nodes already
    built under `starts` (as `fork` makes them) to use as the first step."""
    base = GenSettings.of(gen) or GenSettings()
    results = [AgentResult() for _ in starts]
    pending = list(first) if first is not None else [
        s.final(_gen(base, _choice(tool_choice, 0), _seed(base, i, 0)))
        for i, s in enumerate(starts)]
    live = list(range(len(starts)))
    tokenizer = session.engine.lm.tokenizer
    for step in range(max_steps):
        session.run(pending)
        nxt, still = [], []
        for i, node in zip(live, pending):
            attach_tool_calls(tokenizer, session.tree, node)
            stats = node.result.stats
            tools = run_tools(node, handlers) if node.tool_calls else []
            results[i].steps.append(AgentStep(node, tools, stats.tokens_reused,
                                              stats.tokens_computed, stats.tokens_generated))
            if tools and step + 1 < max_steps:
                choice = _choice(tool_choice, step + 1)
                nxt.append(tools[-1].final(_gen(base, choice, _seed(base, i, step + 1))))
                still.append(i)
        if not nxt:
            break
        pending, live = nxt, still
    return results


def _seed(base: GenSettings, branch: int, step: int) -> int | None:
    """Distinct, repeatable seeds per branch and step (None stays None: fresh randomness)."""
    return None if base.seed is None else base.seed + 1000 * branch + step


def run_agent(session: Any, start: Node, **kw: Any) -> AgentResult:
    """`run_agents` on one branch."""
    return run_agents(session, [start], **kw)[0]


def fork_agents(session: Any, start: Node, k: int, *, gen: GenSettings | dict | None = None,
                tool_choice: ToolChoice = "auto", **kw: Any) -> list[AgentResult]:
    """k agent branches under `start`, the first turn forked with seeds `gen.seed + i` (a
    temperature > 0 makes them differ), then each continued by the loop."""
    base = GenSettings.of(gen) or GenSettings(temperature=0.7)
    seed = base.seed if base.seed is not None else 0
    first = start.fork(k, kind="final", seeds=[seed + 1000 * i for i in range(k)],
                       gen=_gen(base, _choice(tool_choice, 0), None))
    base = base.model_copy(update={"seed": seed})
    return run_agents(session, [start] * k, gen=base, tool_choice=tool_choice, first=first,
                      **kw)
