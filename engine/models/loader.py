"""Turn a model's files into a `LoadedModel`: the mlx-lm (or mlx-vlm) model and tokenizer, the
compute dtype, what was done with quantized weights, the cached K/V format, the cache layout and a
fingerprint that identifies (config, weights, dtype, quantization choice, K/V format) for block
keys.

Which folder a name means (a folder, a GGUF, a demo, a named model, LM Studio, the Hugging
Face hub) is sources.py's business; keeping or dequantizing quantized weights is
quantized.py's. This module knows how a folder becomes a model, not where folders come from.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ... import arenas
from ..cache.layout import CacheLayout, cache_layout
from ..errors import ModelLoadError
from . import blas
from ..native.kvcache import KV_CHOICES, kv_row_widths
from .fingerprint import fingerprint  # whole-content hash, cached by (dev, inode, size, mtime)
from .quantized import QuantChoice, apply_quantized
from .sources import resolve_source
from .special_tokens import eos_token_ids
from .tokenizer_layers import raw_tokenizer

_log = logging.getLogger(__name__)
_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(slots=True)
class LoadedModel:
    name: str
    path: Path
    model: object
    tokenizer: object
    config: dict
    dtype: str
    layout: CacheLayout
    fingerprint: bytes
    context_length: int
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    # Vision models (loaded through mlx-vlm by vision/loader.py): `model` is the whole VLM, its
    # caches are the language model's; `processor` prepares images.
    is_vision: bool = False
    processor: object = None
    image_token_id: int | None = None
    # What quantized weights became ("none", "4-bit kept", "4-bit dequantized to float32"),
    # why, and where the name led (sources.ModelSource.description).
    quantization: str = "none"
    quantization_reason: str = ""
    source: str = ""
    kernels: object = None  # forkv's kernels (engine/native) when the model runs on them
    # whether a verify chunk gives one-token decode's bits (request/speculate.py's probe, run
    # once): None until probed, "" when it does, else why not
    chunk_exactness: str | None = None
    # the dtype cached K/V are stored in: half width where the kernels read them
    # (native/kvcache.py), else float32 (the fingerprint covers it)
    kv_dtype: str = "float32"

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        caches = make_prompt_cache(self.model.language_model if self.is_vision else self.model)
        if self.kv_dtype == "float32":
            return caches
        from ..native.kvcache import half_caches

        return half_caches(caches, self.kv_dtype)

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "?")


def resolve_model_path(name: str) -> Path:
    """The local MLX folder of a model name (see sources.py), building or converting it if
    needed; may download from the Hugging Face hub unless HF_HUB_OFFLINE is set."""
    return resolve_source(name).path


def pick_dtype(requested: str, native: str) -> str:
    """On the CPU float32 is at least as fast as bfloat16 (which never uses BLAS) and exact."""
    import mlx.core as mx

    if requested not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype {requested!r}; choose one of {', '.join(_DTYPES)}.")
    if requested != "auto":
        return requested
    if mx.default_device() == mx.cpu:
        return "float32"
    return native


def load_model(name: str, dtype: str = "auto", quantized: str = "auto", *,
               download: bool = True, kv_dtype: str = "auto") -> LoadedModel:
    """Load any model name (sources.py) for the engine. `dtype`: auto, float32, bfloat16,
    float16; `quantized`: auto, keep, dequantize (quantized.py); `kv_dtype`: what cached K/V
    are stored in where forkv's kernels run attention (auto = float16; elsewhere float32).
    `download=False` takes Hugging Face ids from the local cache only (a server loading what a
    request names)."""
    blas.activate()  # must precede the first mlx import to take effect
    import mlx.core as mx
    from mlx_lm.utils import load_model as mlx_lm_load_model

    from .tokenizer_load import load_tokenizer

    pick_dtype(dtype, "float32")  # a bad dtype fails before any folder is built or converted
    if kv_dtype not in KV_CHOICES:
        raise ModelLoadError(f"Unknown kv_dtype {kv_dtype!r}; choose one of "
                             f"{', '.join(KV_CHOICES)}.")
    source = resolve_source(name, download=download,
                            quantized_gguf=wants_quantized_gguf(quantized))
    path = source.path
    from ..vision.loader import is_vision_folder

    read_config(path)  # a broken or incomplete config.json is named before mlx-lm reads it
    if is_vision_folder(path):
        return _load_vision_model(name, path, dtype, quantized, source.description)
    try:
        # mlx-lm's `load`, in the other order: the tokenizer first, its parse's freed heap
        # handed back, then the weights read. Parsing a 262K-word tokenizer.json needs ~560 MiB
        # for a moment (tokenizer_load.py: 730 before); beside the weights that set the load's
        # peak (Gemma 3 270M: 1,146 MiB).
        model, config = mlx_lm_load_model(path, lazy=True)
        tokenizer = keep_tokenizer(load_tokenizer(path, eos_token_ids=config.get("eos_token_id")))
        arenas.trim()
    except TypeError as e:  # ModelArgs(**config) missing a field its architecture needs
        raise ModelLoadError(_missing_fields(path, e)) from None
    except KeyError as e:
        raise ModelLoadError(f"{str(path / 'config.json')!r} lacks field {e.args[0]!r}, which "
                             "mlx-lm needs to load this model; add it from the model's "
                             "original config.json.") from None
    except (ValueError, FileNotFoundError, OSError) as e:
        raise ModelLoadError(f"Could not load model from {str(path)!r}: {e}") from e
    # The weights are read as they are used: a float table that the kernels' exact groups
    # replace (native/layers.py) is never read at all.
    try:
        chosen, quant = _set_weights(model, config, dtype, quantized, path, kv_dtype)
        mx.eval(model.parameters())
    except ModelLoadError:
        raise
    except (ValueError, OSError) as e:  # a weights file that cannot be read whole
        raise ModelLoadError(f"Could not load model from {str(path)!r}: {e}") from e
    eos = eos_token_ids(path, config, tokenizer)  # configs, tokenizer, template's turn end
    kv = pick_kv_dtype(kv_dtype, model, quant, chosen)
    arenas.trim()  # what parsing the tokenizer and weights freed, back to the system
    return LoadedModel(
        name=name, path=path, model=model, tokenizer=tokenizer, config=config, dtype=chosen,
        layout=cache_layout(_make_cache(model)),
        fingerprint=fingerprint(path, config, chosen, quant.label, _kernels(quant, kv)),
        context_length=_context_length(config), eos_token_ids=frozenset(eos or ()),
        quantization=quant.label, quantization_reason=quant.reason, source=source.description,
        kernels=_kernel_module(quant), kv_dtype=kv,
    )


class _LazyDetokenizer:
    """mlx-lm's streaming detokenizer for a tokenizer wrapper, built on first use. forkv streams
    text with its own (engine/request/textstream.py); the SPM one mlx-lm builds at load holds
    every token's bytes (Gemma 3's 262K words: 17 MiB of the process for its whole life)."""

    def __init__(self, wrapper, cls, kwargs: dict):
        self._wrapper, self._cls, self._kwargs = wrapper, cls, kwargs

    def _built(self):
        real = self._wrapper._detokenizer
        if real is self:
            real = self._cls(self._wrapper._tokenizer, **self._kwargs)
            self._wrapper._detokenizer = real  # built once, as mlx-lm's wrapper keeps it
        return real

    def __copy__(self):  # mlx-lm's `detokenizer` property hands each caller a copy
        return copy.copy(self._built())

    def __getattr__(self, name):
        if name.startswith("_"):  # copy and pickle probe dunders on a bare instance
            raise AttributeError(name)
        return getattr(self._built(), name)


# tokenizers keeps, per thread and per BPE tokenizer, a cache of up to 10,000 pre-tokenized
# words that it never empties (~385 B a word: 3.9 MB a thread; Gemma 3's words are whole runs
# of text, ~2.6 KB). A server tokenizes on its worker threads and rayon's, so a long-running
# one kept filling them with words it saw once (under heaptrack, the largest native growth of
# a soak: at 1,024 words still 10.9 MB more held after 16 minutes than after 6). 256 words
# hold 0.3 MiB a thread for SmolLM2, 0.8 for Gemma 3 (1,024: 0.7 and 2.7); encoding 47K
# tokens of prose takes 71 / 57 ms against 61 / 50 at 1,024 and 78 / 59 with no cache (a
# 16.6K-token chat completion's render and encode: 28.8 / 22 ms against 25.0 / 16.5).
BPE_CACHE_WORDS = 256


def keep_tokenizer(tokenizer):
    """`tokenizer` as a long-lived engine keeps it: the streaming detokenizer built on first use
    (`lazy_detokenizer`), the BPE word cache bounded (`bound_word_cache`)."""
    return bound_word_cache(lazy_detokenizer(tokenizer))


def bound_word_cache(tokenizer, words: int = BPE_CACHE_WORDS):
    """`tokenizer` with its BPE model's per-thread word cache held to `words` entries (a
    tokenizer of another kind, or a tokenizers release without the setting, unchanged)."""
    resize = getattr(getattr(raw_tokenizer(tokenizer), "model", None), "_resize_cache", None)
    if callable(resize):
        resize(words)
    return tokenizer


def lazy_detokenizer(tokenizer):
    """`tokenizer` (mlx-lm's TokenizerWrapper) with its streaming detokenizer freed until a
    caller asks for it (`tokenizer.detokenizer` still works); any other object unchanged."""
    built = getattr(tokenizer, "_detokenizer", None)
    if built is None or isinstance(built, _LazyDetokenizer) or not hasattr(built, "reset"):
        return tokenizer
    kwargs = {"trim_space": built.trim_space} if hasattr(built, "trim_space") else {}
    tokenizer._detokenizer = _LazyDetokenizer(tokenizer, type(built), kwargs)
    return tokenizer


def pick_kv_dtype(requested: str, model, quant: QuantChoice, dtype: str) -> str:
    """The cached K/V dtype: `requested` (auto: native.DEFAULT_KV_DTYPE) where the model's
    attention runs on forkv's kernels (float32 queries), which read half and q8_0 K/V; float32
    elsewhere (mlx's own). q8_0 needs every attention's head_dim in whole groups of 32 (else
    float16, logged)."""
    if requested == "float32" or not quant.native or dtype != "float32":
        return "float32"
    from ..native import DEFAULT_KV_DTYPE
    from ..native.attention import uses_native_attention
    from ..native.kvcache import Q8_GROUP

    if not uses_native_attention(model):
        return "float32"
    if requested == "q8_0":
        dims = kv_row_widths(model, _make_cache(model))
        if not dims or any(d % Q8_GROUP for d in dims):
            _log.warning("q8_0 K/V need head_dim a multiple of %d (this model's: %s); caching "
                         "K/V in float16 instead", Q8_GROUP, sorted(dims))
            return "float16"
    return DEFAULT_KV_DTYPE if requested == "auto" else requested


def _set_weights(model, config: dict, dtype: str, quantized: str, path: Path,
                 kv_dtype: str = "float32") -> tuple[str, QuantChoice]:
    """Keep or dequantize quantized layers, then cast the float weights to the chosen dtype
    (not the scales and biases forkv's kernels read: they stay as the kernels keep them)."""
    import mlx.core as mx

    native = _native_dtype(model)
    chosen = pick_dtype(dtype, native)
    quant = apply_quantized(model, config, quantized, chosen,
                            lambda: read_kernel_groups(path), kv_dtype,
                            lambda: read_kernel_params(path))
    if chosen != native and not quant.dequantized:  # dequantizing already cast them
        target = getattr(mx, chosen)
        if quant.native:
            from mlx.nn import Module

            from ..native.layers import kernel_keys

            def keep(module, key, value):
                return (Module.valid_parameter_filter(module, key, value)
                        and key not in kernel_keys(module))

            model.apply(lambda x: x.astype(target) if mx.issubdtype(x.dtype, mx.floating)
                        else x, keep)
            for _, m in model.named_modules():  # lookups that derive their scales (layers.py)
                if hasattr(m, "lookup_dtype"):
                    m.lookup_dtype = target
        else:
            model.set_dtype(target)
    return chosen, quant


def read_kernel_groups(folder: Path) -> dict:
    """A GGUF conversion's exact groups for forkv's kernels only (gguf/convert.py), by module
    path: {path: (weight, scales, biases, bits, group size)}; {} when the folder has none."""
    import mlx.core as mx

    from .gguf import KERNEL_GROUPS_FILE

    file = folder / KERNEL_GROUPS_FILE
    if not file.is_file():
        return {}
    arrays = mx.load(str(file))
    out = {}
    for key in arrays:
        if key.endswith(".bits_group"):
            module = key.removesuffix(".bits_group")
            bits, group = (int(v) for v in arrays[key].tolist())
            out[module] = (arrays[f"{module}.weight"], arrays[f"{module}.scales"],
                           arrays[f"{module}.biases"], bits, group)
    return out


def read_kernel_params(folder: Path) -> dict:
    """A GGUF conversion's K-quant super-block params for forkv's kernels (gguf/convert.py), by
    module path: {path: uint8 array}; {} when the folder has none."""
    import mlx.core as mx

    from .gguf import KERNEL_GROUPS_FILE

    file = folder / KERNEL_GROUPS_FILE
    if not file.is_file():
        return {}
    return {key.removesuffix(".kparams"): a for key, a in mx.load(str(file)).items()
            if key.endswith(".kparams")}


def wants_quantized_gguf(quantized: str) -> bool:
    """Whether a GGUF should keep its quantized blocks: on the CPU with forkv's kernels."""
    if quantized == "dequantize":
        return False
    import mlx.core as mx

    from .. import native

    return mx.default_device() == mx.cpu and native.load() is not None


def _kernel_module(quant: QuantChoice):
    from .. import native

    return native.load(build=False) if quant.native else None


def _kernels(quant: QuantChoice, kv_dtype: str = "float32") -> str:
    """The kernel paths that change this model's results, for the fingerprint; a half K/V
    format too, so records never restore under another format."""
    from .. import native

    parts = [blas.kernel_label(), native.kernel_label(kv_dtype) if quant.native else ""]
    return "+".join(p for p in parts if p)


def _load_vision_model(name: str, path: Path, dtype: str, quantized: str,
                       source: str) -> LoadedModel:
    """A vision-language model: mlx-vlm loads it (vision/loader.py, which never imports this
    module), the rest is as for text; the fingerprint also covers the image preprocessing."""
    import hashlib

    from ..vision.loader import load_vision_parts

    parts = load_vision_parts(path)
    chosen, quant = _set_weights(parts.model, parts.config, dtype, quantized, path)
    arenas.trim()
    return LoadedModel(
        name=name, path=path, model=parts.model, tokenizer=parts.tokenizer, config=parts.config,
        dtype=chosen, layout=cache_layout(_make_cache(parts.model.language_model)),
        fingerprint=hashlib.sha256(fingerprint(path, parts.config, chosen, quant.label,
                                               _kernels(quant))
                                   + parts.processor_digest).digest(),
        context_length=_context_length(parts.config), eos_token_ids=parts.eos_token_ids,
        is_vision=True, processor=parts.processor, image_token_id=parts.image_token_id,
        quantization=quant.label, quantization_reason=quant.reason, source=source,
        kernels=_kernel_module(quant))


def read_config(path: Path) -> dict:
    """The folder's config.json as a dict; errors name the file, where it breaks and the fix."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{str(file)!r} is not valid JSON ({e.msg} at line {e.lineno}, "
                             f"column {e.colno}); fix or replace the file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"Cannot read {str(file)!r} ({e}); check the file.") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{str(file)!r} has no \"model_type\"; it is not a model config "
                             "(use the model's original config.json).")
    return config


def _missing_fields(path: Path, e: TypeError) -> str:
    import re

    found = re.search(r"missing \d+ required (?:positional |keyword-only )?arguments?: (.+)$",
                      str(e))
    what = f"field(s) {found.group(1)}" if found else f"a field ({e})"
    return (f"{str(path / 'config.json')!r} lacks {what}, which its model_type needs; add "
            "them from the model's original config.json.")


def _make_cache(model) -> list:
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _native_dtype(model) -> str:
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()):
        if "float" in str(v.dtype):
            return str(v.dtype).rsplit(".", 1)[-1]
    return "float32"


def _context_length(config: dict) -> int:
    text = config.get("text_config", config)
    return int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 8192)
