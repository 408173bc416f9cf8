"""forkv: conversation graphs with exact block checkpoints on a batched MLX engine.

`forkv.Session` runs conversation trees (`forkv.Tree`, or declarative `forkv.WorkflowSpec`s);
`forkv.load("demo:gemma3")` gives the engine underneath for a model folder or built-in demo
model. Everything else lives in the submodules: `forkv.graph` (nodes, trees, rendering, errors),
`forkv.engine` (engine, sampling, events, config), `forkv.security` (the encrypted store).
Importing forkv does not import mlx.
"""

from . import _startup

_startup.guard()  # first: a Ctrl-C while the CLI imports is one line, exit 130
from . import arenas, interrupts  # noqa: E402 - after the guard (they import ctypes, signal)

if interrupts.is_cli():
    arenas.limit()  # before any thread: a long-running server's malloc stays bounded

from forkv.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from forkv.graph import Node, Tree, WorkflowSpec  # noqa: E402

from .errors import ForkvError, ForkvWarning  # noqa: E402
from .remote import remote  # noqa: E402
from .session import Session  # noqa: E402

__version__ = "0.1.0"


def load(model: str, *, dtype: str = "auto", block_size: int = 256, chat_template=None,
         **settings) -> Engine:
    """Load a model by name and return its engine: a local folder, a `.gguf` file,
    `gemma3-270m`, an `org/name[@rev]` from LM Studio's models folder or the Hugging Face hub,
    or `demo:<arch>[:<size>]`; keywords are `EngineConfig` settings (`quantized=`, ...).
    `chat_template` (Jinja text or a file) gives a model without one (a base model) a chat
    template for chat messages and Sessions."""
    return Engine(model, dtype=dtype, block_size=block_size, chat_template=chat_template,
                  **settings)


__all__ = [
    "Engine", "EngineConfig", "ForkvError", "ForkvWarning", "Node", "SamplingParams", "Session",
    "Tree", "WorkflowSpec", "__version__", "load", "remote",
]
