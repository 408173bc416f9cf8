"""GGUF files (llama.cpp's format) read safely and converted to MLX model folders.

`convert_gguf(src, out)` writes a folder mlx-lm loads: dequantized weights under mlx-lm's
names, config.json, generation_config.json and the tokenizer from the file's metadata;
`convert_gguf(src, out, quantized=True)` keeps the blocks mlx's affine format holds exactly
(Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K; blocks.py) quantized, the rest as before.
`read_gguf_metadata(path)` and `is_gguf_file(path)` inspect a file without converting it.
Everything here treats the file as untrusted input; problems are one `GGUFError` line.
"""

from __future__ import annotations

import os

from .archs import ARCHS
from .convert import CONVERTER_VERSION, DEFAULT_DTYPE, KERNEL_GROUPS_FILE, convert_gguf
from .header import GGUFError, GGUFHeader, TensorInfo, is_gguf_file, read_gguf_header

__all__ = [
    "CONVERTER_VERSION",
    "DEFAULT_DTYPE",
    "KERNEL_GROUPS_FILE",
    "SUPPORTED_ARCHS",
    "GGUFError",
    "GGUFHeader",
    "TensorInfo",
    "convert_gguf",
    "is_gguf_file",
    "read_gguf_header",
    "read_gguf_metadata",
]

SUPPORTED_ARCHS = tuple(sorted(ARCHS))


def read_gguf_metadata(path: str | os.PathLike) -> dict:
    """The validated metadata key/values of a GGUF file (strings, numbers, lists)."""
    return read_gguf_header(path).metadata
