"""`forkv convert SRC OUT [--q-bits N] [--dtype D]`: write an MLX folder from any model name.

SRC is anything `forkv.load` takes (a folder, a `.gguf` file, `org/name[@rev]`, LM Studio's
models, `gemma3-270m`, a `demo:` name), resolved by `forkv.engine.models.sources`; OUT becomes a
plain MLX folder (config.json, safetensors, tokenizer files) that mlx-lm and other tools load. With
neither option the resolved folder is copied as is (a GGUF arrives converted); `--dtype`
casts the float weights and `--q-bits` quantizes with mlx-lm's own `quantize_model` (a
quantized source is dequantized first). The folder is written next to OUT and renamed into
place, so a failure leaves no half folder; an existing non-empty OUT is refused.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from forkv.errors import ForkvError

__all__ = ["ConvertRefused", "add_arguments", "convert_model", "run_convert"]

_DTYPES = ("float32", "bfloat16", "float16")
_BITS = (2, 3, 4, 5, 6, 8)


class ConvertRefused(ValueError, ForkvError):
    """`forkv convert` would overwrite something, or cannot do what was asked."""


def add_arguments(p) -> None:
    p.add_argument("src", metavar="SRC", help="a model name: folder, .gguf file, "
                   "org/name[@rev], an LM Studio model, gemma3-270m or demo:<arch>[:<size>]")
    p.add_argument("out", metavar="OUT", help="the MLX folder to write (must not exist, or "
                   "be empty)")
    p.add_argument("--q-bits", type=int, choices=_BITS, default=None, metavar="N",
                   help="quantize the weights to N bits with mlx-lm (2, 3, 4, 5, 6 or 8)")
    p.add_argument("--q-group-size", type=int, choices=(32, 64, 128), default=64,
                   help="weights per quantization group (default 64)")
    p.add_argument("--dtype", choices=_DTYPES, default=None,
                   help="cast the float weights (default: keep the source's)")


def run_convert(args) -> int:
    """The `forkv convert` subcommand (arguments from `forkv.cli`)."""
    out, what = convert_model(args.src, args.out, q_bits=args.q_bits, dtype=args.dtype,
                              q_group_size=args.q_group_size)
    print(f"wrote {out} ({what})", file=sys.stderr)
    return 0


def convert_model(src: str, out: str | Path, *, q_bits: int | None = None,
                  dtype: str | None = None, q_group_size: int = 64) -> tuple[Path, str]:
    """Write the MLX folder `out` from model name `src`; returns (out, what was done)."""
    from forkv.engine.models.sources import resolve_source
    from forkv.engine.paths import staged_folder

    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertRefused(f"{str(out)!r} already exists and is not empty; choose a new OUT "
                             "folder or remove that one first.")
    source = resolve_source(src)
    # OUT is the user's folder: the umask's permissions, and a concurrent writer's OUT is not
    # ours to accept (the rename fails).
    with staged_folder(out, mode=None) as target:
        if q_bits is None and dtype is None:
            # Follow links: a Hugging Face snapshot is links into its blob store.
            shutil.copytree(source.path, target, symlinks=False,
                            ignore=shutil.ignore_patterns(".*"))
            what = f"copied from {source.description}"
        else:
            what = _rewrite(source.path, target, q_bits, dtype, q_group_size)
            what += f", from {source.description}"
    return out, what


def _rewrite(path: Path, target: Path, q_bits: int | None, dtype: str | None,
             q_group_size: int) -> str:
    """Load with mlx-lm, dequantize if needed, cast, quantize, save with mlx-lm."""
    from forkv.engine.models import blas

    blas.activate()  # before mlx is imported
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load_model, load_tokenizer, quantize_model, save

    from forkv.engine.models.quantized import describe_quantization
    from forkv.engine.vision.loader import is_vision_folder

    if is_vision_folder(path):
        raise ConvertRefused(f"{str(path)!r} is a vision model; forkv convert only copies those "
                             "(drop --q-bits/--dtype, or use mlx_vlm.convert).")
    model, config = load_model(path, lazy=True)
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    done = []
    was = describe_quantization(config)
    if was is not None:
        dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
        done.append(f"{was} dequantized")
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
        config["torch_dtype"] = dtype
        done.append(f"cast to {dtype}")
    if q_bits is not None:
        model, config = quantize_model(model, config, q_group_size, q_bits)
        done.append(f"quantized to {q_bits}-bit (group size {q_group_size})")
    save(target, path, model, tokenizer, config)
    return ", ".join(done)
