"""forkv.graph: conversation trees as data - build, validate, render to tokens, plan the work.

Imports pydantic, networkx and the standard library only (never mlx): agent code and tools
like `forkv show` can use it without a model. The engine renders paths through `render`, runs
the `Job`s that `plan` returns, and records results with `Tree.attach`.
"""

from .errors import (
    ContextOverflow,
    CycleError,
    DuplicateNode,
    ForeignNode,
    GraphError,
    ImageNotSupported,
    InvalidPlacement,
    ModelMismatch,
    NodeFailed,
    NodeNotFound,
    NodeRemoved,
    NodeStateError,
    SessionError,
    SpecError,
    TreeFormatError,
)
from .export import to_html, to_mermaid, write_html
from .nodes import BlockRef, GenSettings, ImagePart, Node, NodeResult, NodeStats
from .plan import Job, plan
from .render import ImageRef, ReasoningFormat, RenderedPath, Tokenizer, block_range, render
from .spec import ForkSpec, KeepSpec, NodeSpec, WorkflowSpec
from .tools import Constraint, ToolCall, ToolSpec, make_tool
from .tree import Tree

__all__ = [
    "BlockRef",
    "Constraint",
    "ContextOverflow",
    "CycleError",
    "DuplicateNode",
    "ForeignNode",
    "ForkSpec",
    "GenSettings",
    # errors
    "GraphError",
    "ImageNotSupported",
    "ImagePart",
    "ImageRef",
    "InvalidPlacement",
    "Job",
    "KeepSpec",
    "ModelMismatch",
    "Node",
    "NodeFailed",
    "NodeNotFound",
    "NodeRemoved",
    "NodeResult",
    "NodeSpec",
    "NodeStateError",
    "NodeStats",
    "ReasoningFormat",
    "RenderedPath",
    "SessionError",
    "SpecError",
    # rendering and planning
    "Tokenizer",
    # nodes and tree
    "Tree",
    "ToolCall",
    "ToolSpec",
    "TreeFormatError",
    # declarative form
    "WorkflowSpec",
    "block_range",
    "make_tool",
    "plan",
    "render",
    "to_html",
    # seeing the tree
    "to_mermaid",
    "write_html",
]
