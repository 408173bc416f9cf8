"""Typed errors of the session facade (`forkv.Session`).

They extend the graph's hierarchy: each is a `forkv.graph.GraphError` (a `ValueError`) that
carries the offending `node_id` and a one-sentence message naming the node and what to do.
Errors about the tree itself (unknown or removed nodes, another model's tree) are the graph's
own (`NodeNotFound`, `NodeRemoved`, `ModelMismatch`, ...). Knows nothing about running.
"""

from __future__ import annotations

from forkv.graph import GraphError

__all__ = ["ImageNotSupported", "NodeFailed", "SessionError"]


class SessionError(GraphError):
    """Base of the errors `Session` raises itself."""


class NodeFailed(SessionError, RuntimeError):
    """Generating a node raised; the node is marked failed and `__cause__` holds the reason.

    Nodes computed before it keep their results; `tree.reset(node)` makes it pending again.
    """


class ImageNotSupported(SessionError, TypeError):
    """A path to run holds an image, but the loaded model (or engine) cannot take images."""
