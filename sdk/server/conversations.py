"""The Responses API's server-side conversation trees: one `forkv.graph.Tree` per namespace.

A response is a run of nodes in its namespace's tree: the turns its input added (system from
`instructions`, user turns, given assistant turns) and the nodes it generated (a reasoning
node for thinking models, then a final node). `previous_response_id` hangs the new turns under
that response's last node, so two requests naming the same one fork. Deleting a response
removes its subtree (every response built on it too) and returns the block keys only that
subtree used, for the engine to release. Namespaces are tenant plus cache_salt, so a response
id is found only by the tenant (and salt) that made it. Knows nothing about HTTP or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from forkv.graph import GraphError, Tree

from .errors import APIError

__all__ = ["Conversations", "Stored", "Turn"]


@dataclass(slots=True)
class Turn:
    """One input message as a node to add: kind, text, image bytes."""

    kind: str
    text: str
    images: list[bytes] = field(default_factory=list)
    tool_calls: list = field(default_factory=list)  # a function_call item's ToolCall
    tool_call_id: str | None = None  # a function_call_output item's call
    name: str | None = None  # ... and the tool's name


@dataclass(slots=True)
class Stored:
    """A response: its first node (the subtree DELETE removes), last node, and JSON body."""

    id: str
    namespace: str
    first: str
    last: str
    body: dict[str, Any] = field(default_factory=dict)
    done: bool = False


class Conversations:
    def __init__(self, model_id: str, max_responses: int = 100_000):
        self.model_id = model_id
        self.max_responses = max_responses
        self._trees: dict[str, Tree] = {}
        self._responses: dict[str, dict[str, Stored]] = {}

    def tree(self, namespace: str) -> Tree:
        if namespace not in self._trees:
            self._trees[namespace] = Tree(model_id=self.model_id)
            self._responses[namespace] = {}
        return self._trees[namespace]

    def get(self, namespace: str, response_id: str) -> Stored:
        stored = self._responses.get(namespace, {}).get(response_id)
        if stored is None:
            raise APIError(404, f"No response {response_id!r} here (deleted, stored with "
                                "store: false, or made with another API key or cache_salt).",
                           "response_not_found", "previous_response_id")
        return stored

    def counts(self) -> tuple[int, int]:
        """(responses kept, nodes of their trees) over every namespace: what a long-running
        server holds for the Responses API (read from any thread: lengths, in C)."""
        responses = sum(map(len, list(self._responses.values())))
        return responses, sum(map(len, list(self._trees.values())))

    def responses(self, namespace: str) -> list[Stored]:
        """The responses kept in `namespace`, oldest first."""
        return list(self._responses.get(namespace, {}).values())

    def add_turns(self, namespace: str, previous: Stored | None, instructions: str | None,
                  turns: list[Turn], gens: dict[str, Any]) -> tuple[str, list[str]]:
        """Add `turns` and a pending node per entry of `gens` (kind -> its settings, in order)
        under `previous`; (first node, generated ids).

        Consecutive turns of one kind merge into one node, as the tree alternates roles."""
        tree = self.tree(namespace)
        if len(self._responses[namespace]) >= self.max_responses:
            raise APIError(429, f"This namespace holds {self.max_responses} responses; delete "
                                "some (DELETE /v1/responses/ID) before making more.",
                           "too_many_responses")
        parent = previous.last if previous else None
        if previous is not None and not previous.done:
            raise APIError(400, f"Response {previous.id!r} has not finished; continue from it "
                                "once it has.", "response_in_progress", "previous_response_id")
        turns = _merged(turns)
        if instructions:
            if parent is None:
                turns.insert(0, Turn("system", instructions))
            else:
                root = tree.path(parent)[0]
                if root.kind != "system" or root.text != instructions:
                    raise APIError(400, "instructions differ from the conversation's system "
                                        "prompt; omit them when continuing, or start a new "
                                        "conversation.", "invalid_value", "instructions")
        added: list[str] = []
        try:
            for turn in turns:
                node = tree.add(parent, turn.kind, turn.text, images=turn.images,
                                tool_calls=turn.tool_calls, tool_call_id=turn.tool_call_id,
                                name=turn.name)
                added.append(node.id)
                parent = node.id
            gen_ids = []
            for kind, gen in gens.items():
                node = tree.add(parent, kind, gen=gen)
                added.append(node.id)
                gen_ids.append(node.id)
                parent = node.id
        except GraphError as e:
            if added:
                tree.remove(added[0])
            raise APIError(400, f"The input does not continue this conversation: {e}",
                           "invalid_input", "input") from None
        return added[0], gen_ids

    def keep(self, stored: Stored) -> None:
        self._responses[stored.namespace][stored.id] = stored

    def busy_under(self, namespace: str, first: str) -> list[str]:
        """Ids of responses in the subtree at `first` that are still generating."""
        tree = self.tree(namespace)
        inside = {first} | {n.id for n in tree.descendants(first)}
        return [rid for rid, s in self._responses[namespace].items()
                if s.first in inside and not s.done]

    def remove(self, namespace: str, first: str) -> tuple[list[str], set[str]]:
        """Remove the subtree at `first` and every response in it; (response ids, keys only
        it used)."""
        tree = self.tree(namespace)
        keys = tree.keys_only_in(first)
        removed = set(tree.remove(first))
        responses = self._responses[namespace]
        gone = [rid for rid, s in responses.items() if s.first in removed]
        for rid in gone:
            del responses[rid]
        return gone, keys


def _merged(turns: list[Turn]) -> list[Turn]:
    out: list[Turn] = []
    for turn in turns:
        if out and out[-1].kind == turn.kind and turn.kind == "user":
            out[-1] = Turn("user", out[-1].text + "\n\n" + turn.text,
                           out[-1].images + turn.images)
        elif out and out[-1].kind == turn.kind == "final" and turn.tool_calls and not turn.text:
            out[-1] = replace(out[-1], tool_calls=out[-1].tool_calls + turn.tool_calls)
        else:
            out.append(replace(turn, images=list(turn.images)))
    return out
