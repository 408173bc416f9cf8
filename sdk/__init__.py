"""forkv: conversation graphs with exact block checkpoints on a batched MLX engine.

`forkv.load("demo:gemma3")` gives an engine for a model folder or built-in demo model.
Importing forkv does not import mlx.
"""

from forkv.engine import (
    Engine,
    ForkvWarning,
    GenerationError,
    GenerationEvent,
    GenerationResult,
    ModelLoadError,
    SamplingParams,
    Timings,
    UnknownDemoModel,
)
from forkv.graph import (
    GenSettings,
    GraphError,
    ImageNotSupported,
    ImagePart,
    ModelMismatch,
    Node,
    NodeFailed,
    NodeNotFound,
    NodeRemoved,
    NodeStateError,
    NodeStats,
    SessionError,
    ReasoningFormat,
    Tree,
    WorkflowSpec,
    to_html,
    to_mermaid,
    write_html,
)

from .errors import ForkvError
from .runner import NodeEvent
from .session import Session

__version__ = "0.1.0"


def load(model: str, *, dtype: str = "auto", block_size: int = 256) -> Engine:
    """Load a local model folder or a `demo:<arch>[:<size>]` model and return its engine."""
    from forkv.engine import load_model

    return Engine(load_model(model, dtype=dtype), block_size=block_size)


__all__ = [
    "Engine", "ForkvError", "ForkvWarning", "GenerationError", "GenerationEvent", "GenerationResult",
    "ModelLoadError", "SamplingParams", "Timings", "UnknownDemoModel", "load", "__version__",
    "GenSettings", "GraphError", "ImageNotSupported", "ImagePart", "ModelMismatch", "Node",
    "NodeEvent", "NodeFailed", "NodeNotFound", "NodeRemoved", "NodeStateError", "NodeStats",
    "ReasoningFormat", "Session", "SessionError", "Tree", "WorkflowSpec", "to_html",
    "to_mermaid", "write_html",
]
