"""Typed errors of forkv.graph.

Every error subclasses `GraphError` (a `ValueError`) and, where it fits, the matching builtin
(`NodeNotFound` is also a `KeyError`). Each carries the offending `node_id` and a one-sentence
message that names the node and says what to do. This module knows nothing about trees.
"""

from __future__ import annotations

from forkv.errors import ForkvError

__all__ = [
    "ContextOverflow",
    "CycleError",
    "DuplicateNode",
    "ForeignNode",
    "GraphError",
    "ImageNotSupported",
    "InvalidPlacement",
    "ModelMismatch",
    "NodeFailed",
    "NodeNotFound",
    "NodeRemoved",
    "NodeStateError",
    "SessionError",
    "SpecError",
    "TreeFormatError",
]


class GraphError(ForkvError, ValueError):
    """Base of every forkv.graph error; `node_id` names the offending node (or None)."""

    def __init__(self, message: str, node_id: str | None = None):
        super().__init__(message)
        self.node_id = node_id

    def __str__(self) -> str:
        # KeyError would otherwise wrap the message in quotes.
        return str(self.args[0]) if self.args else ""


class NodeNotFound(GraphError, KeyError):
    """A node id (or a parent reference) that the tree does not hold."""


class NodeRemoved(NodeNotFound):
    """A node that `Tree.remove` took out of the tree is used again."""


class ForeignNode(GraphError):
    """A `Node` object that belongs to another tree is passed to this one."""


class DuplicateNode(GraphError):
    """A node id that is already taken (or was taken by a removed node)."""


class InvalidPlacement(GraphError):
    """A node whose kind may not sit under its parent (e.g. reasoning under system)."""


class CycleError(GraphError):
    """Parent references that loop back on themselves (only possible in JSON or specs)."""


class NodeStateError(GraphError):
    """An operation that needs a done node got a pending one, or the other way round."""


class ContextOverflow(GraphError):
    """A node's prompt plus the tokens it may generate exceed the model's context length."""


class ModelMismatch(GraphError):
    """A tree rendered for one model is used with another."""


class TreeFormatError(GraphError):
    """A saved tree or spec that is not a forkv file or has an unknown format version."""


class SpecError(GraphError):
    """A declarative workflow spec that fails validation; `node_id` is the spec node id."""


class SessionError(GraphError):
    """Base of the errors `forkv.Session` raises itself while running a tree."""


class NodeFailed(SessionError, RuntimeError):
    """Generating a node raised; the node is marked failed and `__cause__` holds the reason.

    Nodes computed before it keep their results; `tree.reset(node)` makes it pending again.
    """


class ImageNotSupported(SessionError, TypeError):
    """A path to run holds an image, but the loaded model (or engine) cannot take images."""
