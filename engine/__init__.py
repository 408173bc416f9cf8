"""forkv.engine: model loading, cache layout, block checkpoints and the MLX generation engine.

Importing this package does not import mlx (the optimized BLAS must be loaded first); mlx is
imported when a model is loaded.
"""

from .batch import BatchEngine, RequestHandle, generate_batch
from .engine import DEFAULT_BLOCK_SIZE, Engine
from .errors import ForkvWarning, GenerationError, ModelLoadError, UnknownDemoModel
from .events import GenerationEvent, GenerationResult, Timings
from .layout import CacheKind, CacheLayout
from .loader import LoadedModel, load_model
from .sampling import SamplingParams

__all__ = [
    "DEFAULT_BLOCK_SIZE", "BatchEngine", "CacheKind", "CacheLayout", "Engine", "ForkvWarning",
    "GenerationError", "GenerationEvent", "GenerationResult", "LoadedModel", "ModelLoadError",
    "RequestHandle", "SamplingParams", "Timings", "UnknownDemoModel", "generate_batch",
    "load_model",
]
