"""forkv.engine: model loading, cache layout, block checkpoints and the MLX generation engine.

One request path: `Engine.submit` returns a `RequestHandle`; the request joins the continuous
batch on the engine's own thread (every mlx call runs there). Importing this package does not
import mlx (the optimized BLAS must be loaded first); mlx is imported when a model is loaded.
"""

from .config import EngineConfig, EngineConfigError
from .engine import DEFAULT_BLOCK_SIZE, Engine, generate_batch
from .errors import EngineClosed, ForkvWarning, GenerationError, ModelLoadError, UnknownDemoModel
from .events import GenerationEvent, GenerationResult, Timings
from .handle import RequestHandle
from .layout import CacheKind, CacheLayout
from .loader import LoadedModel, load_model
from .sampling import SamplingParams

__all__ = [
    "DEFAULT_BLOCK_SIZE", "CacheKind", "CacheLayout", "Engine", "EngineClosed", "EngineConfig",
    "EngineConfigError", "ForkvWarning", "GenerationError", "GenerationEvent",
    "GenerationResult", "LoadedModel", "ModelLoadError", "RequestHandle", "SamplingParams",
    "Timings", "UnknownDemoModel", "generate_batch", "load_model",
]
