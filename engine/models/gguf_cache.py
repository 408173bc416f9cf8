"""GGUF files converted once into forkv's cache, keyed by what they hold.

`converted_folder(file)` returns `<forkv cache>/gguf/<digest>-<CONVERTER_VERSION>/`, an MLX
folder written by the GGUF converter (`forkv.engine.models.gguf.convert_gguf`): the digest is the
file's whole-content BLAKE3 (`fingerprint.file_digest`, cached by inode and mtime, so a second
load reads no byte of it), so a renamed or copied file hits and an edited one converts again;
a new converter version converts again too. A `dtype` other than the default and the
quantized mode (`-q`: the blocks kept as mlx affine tensors) each get their own folder. The
conversion is written to a private temp sibling and renamed into place (`paths.staged_folder`),
so a crash or a concurrent converter never leaves half a folder. The cache folder is private
(0700). Knows nothing of the GGUF format itself.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from ..paths import private_cache_folder, staged_folder
from .fingerprint import file_digest

__all__ = ["converted_folder", "converter_version"]


def converted_folder(file: Path, *, dtype: str | None = None,
                     quantized: bool = False) -> tuple[Path, str]:
    """(the converted MLX folder for `file`, the converter version), converting if needed;
    `quantized` keeps the blocks mlx can hold exactly quantized (convert_gguf's mode)."""
    convert, version, gguf_error = _converter()
    key = (f"{file_digest(file)[:32]}-{version}" + (f"-{dtype}" if dtype else "")
           + ("-q" if quantized else ""))
    folder = private_cache_folder("gguf") / key
    if is_complete(folder):
        return folder, version
    try:
        write_atomically(folder, lambda out: convert(file, out, dtype=dtype, quantized=quantized))
    except gguf_error as e:
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"Cannot convert {str(file)!r}: {e}") from None
    return folder, version


def converter_version() -> str:
    """The installed GGUF converter's version (part of every conversion's cache key)."""
    return _converter()[1]


def is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def write_atomically(folder: Path, write) -> Path:
    """`write(out)` a model folder (0700) beside `folder`, then rename it to `folder`."""
    with staged_folder(folder, done=is_complete) as out:
        write(out)
        if not is_complete(out):
            raise ModelLoadError(f"The converter wrote no model into {str(out)!r}; this is a "
                                 "forkv bug, please report it.")
    return folder


def _converter():
    try:
        from .gguf import CONVERTER_VERSION, GGUFError, convert_gguf
    except ImportError as e:
        raise ModelLoadError(f"This forkv cannot convert GGUF files ({e}); reinstall forkv "
                             "(pip install -e .).") from None
    return convert_gguf, str(CONVERTER_VERSION), GGUFError
