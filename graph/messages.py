"""The chat messages of a path's done nodes, as a chat template is given them.

Knows how node kinds map to chat roles (a reasoning node joins the final after it as its
`reasoning_content`; a final node's tool calls become the message's `tool_calls`, written by
the template in its own syntax), and how to read them back from the signatures a render kept
(`_Seen`), so a rendered path's messages are written only when asked for. Knows nothing of
templates, tokens or spans.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .nodes import Node
    from .toolformat import ToolFormat

__all__: list[str] = []  # (the package's own: render.py and path_text.py use these)


def _content(node: Node) -> Any:
    if not node.images:
        return node.text or ""
    return [{"type": "image"} for _ in node.images] + [{"type": "text", "text": node.text or ""}]


def _messages(nodes: Sequence[Node], calls: ToolFormat | None = None) -> list[dict[str, Any]]:
    """Chat messages for done nodes; a reasoning node joins the final after it. A final node's
    tool calls become the message's `tool_calls` and leave its content (`calls` says how
    they are written in generated text), so the template writes them its own way."""
    out: list[dict[str, Any]] = []
    reasoning: str | None = None
    for node in nodes:
        if node.kind == "reasoning":
            reasoning = node.text or ""
            continue
        msg: dict[str, Any] = {
            "role": "assistant" if node.kind == "final" else node.kind,
            "content": _content(node),
        }
        if node.kind == "final" and reasoning is not None:
            msg["reasoning_content"] = reasoning
        if node.tool_calls:
            if calls is not None and isinstance(msg["content"], str):
                msg["content"] = calls.split(msg["content"])[0]
            msg["tool_calls"] = [c.to_message() for c in node.tool_calls]
        if node.kind == "tool" and node.name:
            msg["name"] = node.name
        if node.kind == "tool" and node.tool_call_id:
            msg["tool_call_id"] = node.tool_call_id
        reasoning = None
        out.append(msg)
    return out


_kind = operator.attrgetter("kind")


class _Seen(NamedTuple):
    """A node as its `signature` saw it (the same fields, in order): what its message needs."""

    id: str
    kind: str
    status: str
    text: str | None
    name: str | None
    tool_call_id: str | None
    images: tuple  # (their hashes: the message counts them)
    tool_calls: tuple


def _snapshot_messages(sigs: Sequence[tuple] = (), calls: ToolFormat | None = None
                       ) -> list[dict[str, Any]]:
    """`_messages` of nodes as their signatures `sigs` recorded them."""
    return _messages([_Seen(*sig) for sig in sigs], calls)


class _Ids(Sequence):
    """The ids of some nodes, read as asked (a chat's states are looked up from its end)."""

    def __init__(self, nodes: Sequence[Node]):
        self.nodes = nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i):
        return self.nodes[i].id

    def __reversed__(self):
        return (n.id for n in reversed(self.nodes))


class _Chat:
    """The chat of some done nodes (chat_render.Chat): one message per node but reasoning,
    which joins the final after it."""

    def __init__(self, nodes: Sequence[Node], sigs: Sequence[tuple],
                 calls: ToolFormat | None):
        self.nodes, self.sigs, self.calls = nodes, sigs, calls
        kinds = list(map(_kind, nodes))  # (in C: a deep chat often has no reasoning at all)
        self._at = ([i for i, k in enumerate(kinds) if k != "reasoning"]
                    if "reasoning" in kinds else list(range(len(kinds))))
        self.num_messages = len(self._at)

    @property
    def ids(self) -> _Ids:
        return _Ids(self.nodes)

    def messages(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        at = self._at[start:stop]
        if not at:
            return []
        first = at[0]
        if first and self.nodes[first - 1].kind == "reasoning":
            first -= 1  # its reasoning goes into its message
        return _messages(self.nodes[first:at[-1] + 1], self.calls)
