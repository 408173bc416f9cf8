"""forkv.engine: model loading, cache layout, block checkpoints and the MLX generation engine.

One request path: `Engine.submit` returns a `RequestHandle`; the request joins the continuous
batch on the engine's own thread (every mlx call runs there). Importing this package does not
import mlx (the optimized BLAS must be loaded first); mlx is imported when a model is loaded.

Layout, one subpackage per concern: `request/` (scheduler, sequences, sampling, the engine
thread), `cache/` (prefix cache, record kinds, records, store and tiers), `models/` (model
names, loading, GGUF, formats, BLAS), `vision/` (images, vision towers, image checkpoints),
`demo/` (tiny offline models), `native/` (forkv's CPU kernels). At the top: `Engine` and what
they all share (config, errors, events, handles, paths, stats).
"""

from .cache.layout import CacheKind, CacheLayout
from .config import EngineConfig, EngineConfigError
from .engine import DEFAULT_BLOCK_SIZE, Engine, generate_batch
from .errors import EngineClosed, ForkvWarning, GenerationError, ModelLoadError, UnknownDemoModel
from .events import GenerationEvent, GenerationResult, Timings
from .handle import RequestHandle
from .models.loader import LoadedModel, load_model
from .request.sampling import SamplingParams

__all__ = [
    "DEFAULT_BLOCK_SIZE", "CacheKind", "CacheLayout", "Engine", "EngineClosed", "EngineConfig",
    "EngineConfigError", "ForkvWarning", "GenerationError", "GenerationEvent",
    "GenerationResult", "LoadedModel", "ModelLoadError", "RequestHandle", "SamplingParams",
    "Timings", "UnknownDemoModel", "generate_batch", "load_model",
]
