"""`convert_gguf`: one GGUF file to an MLX / Hugging Face-format folder that mlx-lm loads.

Validates the whole header first (header.py), so nothing is written for a file that is
malformed or uses an architecture, tensor type or tokenizer forkv cannot convert; then
dequantizes tensor by tensor into streamed safetensors shards, writes config.json,
generation_config.json, the tokenizer files and `forkv_gguf.json`, all into a temp folder
renamed into place at the end. With `quantized=True` the tensors blocks.py maps exactly stay
quantized, as mlx affine `weight` / `scales` / `biases` triples with mlx-lm's per-module
quantization config; the ones whose groups mlx cannot hold (Q6_K's 16) stay float there for
mlx and go, exactly, into `KERNEL_GROUPS_FILE` for forkv's kernels. Knows nothing about
caching: the caller picks `out`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from ...paths import staged_folder
from .archs import SKIPPED, arch_for, permute_rows
from .blocks import GROUP_SIZE, KERNEL_ONLY, affine_bits, k_params, to_affine
from .config import make_config, make_generation_config
from .header import GGUFError, read_gguf_header, read_tensor_bytes
from .tensors import STORAGE_DTYPES, SUPPORTED_TYPES, dequantize, to_storage
from .tokenizer import save_tokenizer
from .writer import ShardWriter

__all__ = ["CONVERTER_VERSION", "DEFAULT_DTYPE", "KERNEL_GROUPS_FILE", "convert_gguf"]

# Bump when the output of a conversion changes, so caches keyed on it are rebuilt.
# 3: Q6_K's exact 16-wide groups in KERNEL_GROUPS_FILE (2 was never released).
# 4: the K-quants' super-block params (`<module>.kparams`) in KERNEL_GROUPS_FILE.
CONVERTER_VERSION = 4
# Quantized mode: `<module>.weight/.scales/.biases/.bits_group` (int32 [bits, group size])
# for the modules whose groups only forkv's kernels take; model.safetensors holds them float.
# Also `<module>.kparams` for every Q4_K, Q5_K and Q6_K module (blocks.py `k_params`).
KERNEL_GROUPS_FILE = "forkv_kernel_groups.safetensors"
# Measured on the real Gemma 3 270M Q4_K_M with float32 compute: bfloat16 storage of the
# dequantized Q4/Q5/Q8 weights moved perplexity 9.7871 -> 9.7905, 1 of 166 top-1 tokens and the
# greedy continuation from its 26th token. float32 keeps exactly what the reference kernels
# compute, at twice bfloat16's disk (1.07 GB vs 0.54 GB there); pass dtype= to trade.
DEFAULT_DTYPE = "float32"


def convert_gguf(src: Path, out: Path, *, dtype: str | None = None,
                 quantized: bool = False) -> Path:
    """Convert the GGUF file `src` into the model folder `out` (which must not exist) and return
    `out`. F32 tensors stay float32; quantized, F16 and BF16 ones are stored as `dtype`
    ("float32", "bfloat16" or "float16"; default `DEFAULT_DTYPE`), except that with
    `quantized` the ones blocks.py maps stay quantized (their values exactly the same).
    Raises `GGUFError` (a `ModelLoadError`) naming the file and the problem."""
    src, out = Path(src), Path(out)
    storage = dtype or DEFAULT_DTYPE
    if storage not in STORAGE_DTYPES:
        raise GGUFError(f"dtype {storage!r} is not one a GGUF conversion writes; use one of "
                        f"{', '.join(STORAGE_DTYPES)}.")
    if out.exists():
        raise GGUFError(f"output folder {out} already exists; remove it or pick another.")
    header = read_gguf_header(src)
    arch = arch_for(header.metadata, src)
    plan, names, bits = [], {}, {}  # bits: GGUF name -> bit width, for the ones kept quantized
    kernel_only = set()  # GGUF names also written, exactly, to KERNEL_GROUPS_FILE
    for info in header.tensors.values():
        if info.name in SKIPPED:
            continue
        if info.type_name not in SUPPORTED_TYPES:
            raise GGUFError(f"GGUF file {src}: tensor {info.name!r} has type {info.type_name}, "
                            f"which forkv cannot convert; supported: "
                            f"{', '.join(SUPPORTED_TYPES)}.")
        names[info.name] = arch.map_name(info.name)
        b = affine_bits(info) if quantized else None
        # A shifted norm's restored values are not the blocks' values; only .weight tensors
        # belong to modules mlx-lm quantizes.
        if b and not arch.shifted(info.name) and names[info.name].endswith(".weight"):
            if info.type_name in KERNEL_ONLY:  # float here too, for mlx: see below
                kernel_only.add(info.name)
            else:
                bits[info.name] = b
                plan += _quantized_plan(names[info.name], info.shape, b)
                continue
        tag = "F32" if info.type_name == "F32" else STORAGE_DTYPES[storage]
        plan.append((names[info.name], info.shape, tag))
    rope = header.tensors.get("rope_freqs.weight")
    with open(src, "rb") as f:
        config = make_config(header, arch, dequantize(header, rope, f) if rope else None)
    config["torch_dtype"] = storage
    if bits:
        config["quantization"] = _quantization_config(
            {names[n].removesuffix(".weight"): b for n, b in bits.items()})
        config["quantization_config"] = config["quantization"]  # as mlx-lm's save writes it
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    # forkv_gguf.json is written last: with it, a concurrent conversion that renamed first won.
    try:
        with staged_folder(out, done=lambda f: (f / "forkv_gguf.json").exists()) as tmp:
            tmp.mkdir(mode=0o700)
            save_tokenizer(header, tmp)  # first: a bad vocabulary fails before minutes of weights
            writer = ShardWriter(tmp, plan, metadata={"forkv_gguf": src.name})
            kernel_groups: dict = {}
            with open(src, "rb") as f:
                for info in header.tensors.values():
                    if info.name in bits:
                        order = arch.row_order(info.name, info.shape[0], heads, kv_heads)
                        raw = read_tensor_bytes(header, info, f)
                        kernel_groups.update(_kernel_params(names[info.name], info, order, raw))
                        _write_quantized(writer, names[info.name], info, order, raw)
                        del raw
                    elif info.name in names:
                        if info.name in kernel_only:
                            order = arch.row_order(info.name, info.shape[0], heads, kv_heads)
                            raw = read_tensor_bytes(header, info, f)
                            kernel_groups.update(_kernel_groups(names[info.name], info, order,
                                                                raw))
                            kernel_groups.update(_kernel_params(names[info.name], info, order,
                                                                raw))
                            del raw
                        w = arch.restore(info.name, dequantize(header, info, f), heads, kv_heads)
                        tag = "float32" if info.type_name == "F32" else storage
                        writer.write(names[info.name], to_storage(w, tag))
                        del w  # one tensor in memory at a time
            writer.close()
            if kernel_groups:
                from safetensors.numpy import save_file

                save_file(kernel_groups, str(tmp / KERNEL_GROUPS_FILE), metadata={
                    "format": "forkv-kernel-groups-1", "forkv_gguf": src.name})
            _write_json(tmp / "config.json", config)
            _write_json(tmp / "generation_config.json", make_generation_config(header, arch))
            record = {"source": src.name, "source_bytes": header.file_size,
                      "converter_version": CONVERTER_VERSION, "architecture": arch.name,
                      "dtype": storage, "gguf_version": header.version}
            if quantized:  # only then: a float conversion's folder stays byte for byte as it was
                kinds = {n: header.tensors[n].type_name for n in names}
                record.update(quantized=True, quantized_tensors=_counts(
                    t for n, t in kinds.items() if n in bits), float_tensors=_counts(
                    t for n, t in kinds.items() if n not in bits), kernel_groups=_counts(
                    t for n, t in kinds.items() if n in kernel_only))
            _write_json(tmp / "forkv_gguf.json", record)
    except OSError as e:
        raise GGUFError(f"converting {src} into {out} failed: {e}.") from None
    return out


def _quantized_plan(name: str, shape: tuple[int, ...], bits: int) -> list:
    rows, cols = shape
    module = name.removesuffix(".weight")
    return [(name, (rows, cols * bits // 32), "U32"),
            (f"{module}.scales", (rows, cols // GROUP_SIZE), "F32"),
            (f"{module}.biases", (rows, cols // GROUP_SIZE), "F32")]


def _write_quantized(writer: ShardWriter, name: str, info, order, raw) -> None:
    weight, scales, biases, _, _ = to_affine(info, raw)
    del raw
    module = name.removesuffix(".weight")
    for key, a in ((name, weight), (f"{module}.scales", scales), (f"{module}.biases", biases)):
        # llama's q/k un-permutation moves whole rows: of the packed words as of the values.
        writer.write(key, a if order is None else permute_rows(a, order))


def _kernel_groups(name: str, info, order, raw) -> dict:
    """One KERNEL_ONLY tensor's exact triple, with its bits and group size, by module name."""
    weight, scales, biases, b, group = to_affine(info, raw)
    module = name.removesuffix(".weight")
    arrays = {"weight": weight, "scales": scales, "biases": biases}
    out = {f"{module}.{k}": np.ascontiguousarray(a if order is None else permute_rows(a, order))
           for k, a in arrays.items()}
    out[f"{module}.bits_group"] = np.array([b, group], np.int32)
    return out


def _kernel_params(name: str, info, order, raw) -> dict:
    """A K-quant tensor's super-block params for the kernels (blocks.py `k_params`), by module
    name ({} for other types): what they read instead of float32 scales and biases."""
    params = k_params(info, raw)
    if params is None:
        return {}
    return {f"{name.removesuffix('.weight')}.kparams": np.ascontiguousarray(
        params if order is None else permute_rows(params, order))}


def _quantization_config(modules: dict[str, int]) -> dict:
    """mlx-lm's `quantization`: a default plus one entry per quantized module, so its loader
    quantizes exactly these modules (`nn.quantize`'s predicate looks each path up first)."""
    default = Counter(modules.values()).most_common(1)[0][0]
    config: dict = {"group_size": GROUP_SIZE, "bits": default, "mode": "affine"}
    for module, b in modules.items():
        config[module] = {"group_size": GROUP_SIZE, "bits": b, "mode": "affine"}
    return config


def _counts(kinds) -> dict[str, int]:
    return dict(sorted(Counter(kinds).items()))


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
