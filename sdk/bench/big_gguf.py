"""A ~1B-parameter llama GGUF for the benches, made here: random weights at Llama 3.2 1B's
shapes, so forkv and llama-server can be compared where weight bandwidth, not per-op cost,
dominates, without downloading a model.

`write_llama_gguf(path, shape)` writes a llama-architecture GGUF with the `gguf` package's
writer, tensor by tensor (RAM stays at about one tensor): seeded normal weights (std 0.02,
norms 1, so activations stay small and finite), tied embeddings, the tokenizer metadata and
chat template copied from the registry's SmolLM2 GGUF (a llama-style BPE tokenizer, 49,152
tokens, already on this machine), the 2-D weights as F16 or any type `gguf.quants` can make.
`make_llama_1b_gguf(quant="Q4_K_M")` writes the F16 file and quantizes it with llama.cpp's own
`llama-quantize`, built from the same llama-cpp-python sdist as the bench's llama-server
(`llamacpp.llama_quantize_path`); where that cannot be built it falls back to the gguf
package's quantizers, which have no K-quants (Q4_K_M becomes Q4_0 weights with a Q8_0
embedding; the file's name says which). The result lives in `<forkv cache>/bench/` (a 0700
folder, 0600 files) under a name keyed by everything that decides its bytes (this writer's
version, the shape, the seed, the tokenizer's source, the quantizer binary's digest), so it is
built once; the F16 intermediate is deleted. `big_model_name()` is the path the benches take.

Llama 3.2 1B's weights shapes exactly except the vocabulary (49,152 rows, SmolLM2's, instead of
128,256: about 1.07B parameters, not 1.24B) and without its llama3 rope scaling (forkv's
converter skips `rope_freqs.weight`, so both sides would compute different models).

`measure_side_by_side(path)` runs `forkv serve` and llama-server on the file, both up at once,
and measures both the same way through the openai client in alternating rounds (the side
that goes first alternates; figures are medians): prefill tok/s of a fresh ~512-token prompt
(prompt tokens computed / time to first token) and greedy decode tok/s (end-of-sequence
suppressed; (tokens - 1) / (last token - first token)). One run of each side after the other
read 0.62 one minute and 0.93 the next on a shared 2-core machine; rounds in the same minutes
do not. `python -m forkv.bench.big_gguf [--measure] [--rounds N]` prints the path (building it
if missing) and, with --measure, the figures as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["GENERATOR_VERSION", "LLAMA_3_2_1B", "LlamaShape", "big_model_name",
           "fallback_type", "make_llama_1b_gguf", "measure_side_by_side", "write_llama_gguf"]

# Bump when the bytes written for the same arguments change: cached files are keyed on it.
GENERATOR_VERSION = 1
_QUANTIZE_TIMEOUT_S = 3600


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """A llama model's sizes (and the settings written beside them)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    context_length: int = 131072
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5

    def params(self, vocab: int) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return vocab * self.hidden + self.layers * (attn + mlp + 2 * self.hidden) + self.hidden


LLAMA_3_2_1B = LlamaShape(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                          intermediate=8192)

# What the gguf package's quantizers make for a requested llama-quantize type: (the 2-D
# weights' type, the embedding's). They have no K-quants; the embedding (also the output,
# tied) keeps more bits, as llama-quantize's mixes do.
_FALLBACK = {"Q4_K_M": ("Q4_0", "Q8_0"), "Q4_K_S": ("Q4_0", "Q8_0"), "Q4_0": ("Q4_0", "Q8_0"),
             "Q4_1": ("Q4_1", "Q8_0"), "Q5_K_M": ("Q5_0", "Q8_0"), "Q5_K_S": ("Q5_0", "Q8_0"),
             "Q5_0": ("Q5_0", "Q8_0"), "Q5_1": ("Q5_1", "Q8_0"), "Q6_K": ("Q8_0", "Q8_0"),
             "Q8_0": ("Q8_0", "Q8_0"), "F16": ("F16", "F16"), "BF16": ("BF16", "BF16")}


def fallback_type(quant: str) -> str:
    """The type name the gguf-package fallback gives a requested `quant` (its weights')."""
    if quant not in _FALLBACK:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(_FALLBACK)}.")
    return _FALLBACK[quant][0]


def _tokenizer_source(download: bool = False) -> Path:
    """The GGUF whose tokenizer is copied: the registry's SmolLM2 file (never downloaded unless
    `download`; forkv fetches it once with `forkv pull smollm2-135m`)."""
    from forkv.engine.models.named import NAMED_MODELS

    return Path(NAMED_MODELS["smollm2-135m"].gguf_path(download=download))


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # GGUF value type -> struct format (8: string, 9: array)


def _tokenizer_fields(src: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, type, sub type) of every tokenizer.* field of `src`, read straight from its
    key/value section (the gguf package's reader takes seconds over 100K strings). The file is
    a trusted local one (the registry's, checked by digest when it was fetched)."""
    import mmap
    import struct

    from gguf import GGUFValueType

    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, version, _, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{src} is not a GGUF file of version 2 or later")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
            return bytes(buf[pos - n:pos]).decode("utf-8")

        def value(vtype: int):
            nonlocal pos
            if vtype == 8:
                return string()
            fmt = _SCALARS[vtype]
            (v,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return v

        out = []
        for _ in range(n_kv):
            key = string()
            (vtype,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            sub = None
            if vtype == 9:
                sub, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if sub == 8:
                    val = [string() for _ in range(count)]
                else:
                    fmt = _SCALARS[sub]
                    size = struct.calcsize(fmt)
                    val = list(struct.unpack_from(f"<{count}{fmt[1]}", buf, pos))
                    pos += count * size
            else:
                val = value(vtype)
            if key.startswith("tokenizer."):
                out.append((key, val, GGUFValueType(vtype),
                            None if sub is None else GGUFValueType(sub)))
    return out


def _tensor_plan(shape: LlamaShape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape) in llama.cpp's order; tied embeddings: no output.weight."""
    h, q, kv, ff = (shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim,
                    shape.intermediate)
    plan = [("token_embd.weight", (vocab, h))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (q, h)),
                 (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h)),
                 (b + "attn_output.weight", (h, q)), (b + "ffn_norm.weight", (h,)),
                 (b + "ffn_gate.weight", (ff, h)), (b + "ffn_up.weight", (ff, h)),
                 (b + "ffn_down.weight", (h, ff))]
    return plan + [("output_norm.weight", (h,))]


def _values(name: str, dims: tuple[int, ...], seed: int, std: float) -> np.ndarray:
    """The tensor's float32 values: ones for norms, else seeded N(0, std) (seeded by name, so
    one tensor's values never depend on another's)."""
    if len(dims) == 1:
        return np.ones(dims, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    out = rng.standard_normal(dims, dtype=np.float32)
    out *= np.float32(std)
    return out


def write_llama_gguf(path: str | os.PathLike, shape: LlamaShape = LLAMA_3_2_1B, *,
                     seed: int = 0, weight_type: str = "F16", embedding_type: str | None = None,
                     std: float = 0.02, tokenizer_gguf: str | os.PathLike | None = None,
                     name: str = "forkv random llama") -> Path:
    """Write a llama GGUF at `shape` to `path` (replaced if there): random weights (see the
    module docstring), the 2-D weights as `weight_type` and the (tied) embedding as
    `embedding_type` (default: the same), each F32, F16, BF16 or a type `gguf.quants` makes
    (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); norms F32. Deterministic for the same arguments."""
    import gguf
    from gguf import GGMLQuantizationType as T

    path = Path(path)
    types = (weight_type, embedding_type or weight_type)
    for t in types:
        if t not in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
            raise ValueError(f"write_llama_gguf cannot write {t!r} tensors; use F32, F16, "
                             "BF16, Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 (llama-quantize the rest).")
    fields = _tokenizer_fields(Path(tokenizer_gguf) if tokenizer_gguf else _tokenizer_source())
    tokens = next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens")
    vocab = len(tokens)
    plan = _tensor_plan(shape, vocab)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_type("model")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(vocab)
    file_type = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}.get(
        weight_type, f"MOSTLY_{weight_type}")
    w.add_file_type(int(gguf.LlamaFileType[file_type]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub)

    def type_of(tensor: str, dims) -> str:
        if len(dims) == 1:
            return "F32"
        return types[1] if tensor == "token_embd.weight" else types[0]

    for tensor, dims in plan:
        t = T[type_of(tensor, dims)]
        if t in (T.F32, T.F16):
            dtype = np.float32 if t == T.F32 else np.float16
            w.add_tensor_info(tensor, dims, np.dtype(dtype), int(np.prod(dims)) * (
                4 if t == T.F32 else 2))
        else:
            block, size = gguf.GGML_QUANT_SIZES[t]
            byte_dims = (*dims[:-1], dims[-1] // block * size)
            w.add_tensor_info(tensor, byte_dims, np.dtype(np.uint8), int(np.prod(byte_dims)),
                              raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tensor, dims in plan:
        t = T[type_of(tensor, dims)]
        data = _values(tensor, dims, seed, std)
        if t == T.F16:
            data = data.astype(np.float16)
        elif t != T.F32:
            data = gguf.quants.quantize(data, t)
        w.write_tensor_data(data)
        del data
    w.close()
    return path


# -- the cached 1B file ----------------------------------------------------------------------
def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _quantizer(quantizer: str, build: bool) -> tuple[Path | None, str]:
    """(llama-quantize binary or None for the gguf package, its identity for the cache key)."""
    import gguf  # noqa: F401 - its version is part of the key either way

    from .common import _version

    if quantizer not in ("auto", "llama", "gguf"):
        raise ValueError(f"quantizer must be auto, llama or gguf, got {quantizer!r}.")
    if quantizer != "gguf":
        from .llamacpp import LlamaServerMissing, llama_quantize_path

        try:
            binary = llama_quantize_path(build=build)
            return binary, f"llama-quantize:{_file_sha(binary)[:16]}"
        except LlamaServerMissing as e:
            if quantizer == "llama":
                raise
            print(f"big_gguf: no llama-quantize ({str(e).splitlines()[0]}); using the gguf "
                  "package's quantizers", file=sys.stderr)
    return None, f"gguf-py:{_version('gguf')}"


def _cache_key(shape: LlamaShape, seed: int, quant: str, quantizer_id: str,
               tokenizer_id: str) -> str:
    blob = json.dumps({"generator": GENERATOR_VERSION, "shape": asdict(shape), "seed": seed,
                       "quant": quant, "quantizer": quantizer_id, "tokenizer": tokenizer_id},
                      sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _tokenizer_id() -> str:
    from forkv.engine.models.named import NAMED_MODELS

    return "smollm2-135m:" + NAMED_MODELS["smollm2-135m"].digest()


def make_llama_1b_gguf(path: str | os.PathLike | None = None, quant: str = "Q4_K_M", *,
                       quantizer: str = "auto", build: bool = True, seed: int = 0,
                       shape: LlamaShape = LLAMA_3_2_1B) -> Path:
    """The random-weights llama GGUF at `shape` (default Llama 3.2 1B's), quantized as `quant`:
    `path` if given (written, or rewritten), else the cached file in `<forkv cache>/bench/`,
    made once. `quantizer`: "llama" (llama-quantize; built into forkv's cache if `build` and
    missing), "gguf" (the gguf package: K-quants fall back, see `fallback_type`), "auto" (llama,
    else gguf). The returned file's name ends in the type its weights actually have."""
    if quant not in _FALLBACK:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(_FALLBACK)}.")
    binary, quantizer_id = _quantizer("gguf" if quant in ("F16", "BF16") else quantizer, build)
    actual = quant if binary is not None or quant in ("F16", "BF16") else fallback_type(quant)
    key = _cache_key(shape, seed, quant, quantizer_id, _tokenizer_id())
    label = "llama-1b" if shape == LLAMA_3_2_1B else f"llama-h{shape.hidden}-l{shape.layers}"
    if path is None:
        from forkv.engine.paths import private_cache_folder

        target = private_cache_folder("bench") / f"{label}-{actual}-{key}.gguf"
        if target.is_file():
            return target
    else:
        target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    stage = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=target.parent))  # 0700
    try:
        out = stage / "out.gguf"
        if binary is None:
            weights, embedding = _FALLBACK[quant]
            write_llama_gguf(out, shape, seed=seed, weight_type=weights,
                             embedding_type=embedding)
        else:
            f16 = stage / "f16.gguf"
            write_llama_gguf(f16, shape, seed=seed, weight_type="F16")
            wrote = time.perf_counter()
            _llama_quantize(binary, f16, out, quant, stage / "quantize.log")
            f16.unlink()  # gigabytes: gone before the rename, not after
            print(f"big_gguf: F16 written in {wrote - t0:.0f}s, quantized to {quant} by "
                  f"{binary} in {time.perf_counter() - wrote:.0f}s", file=sys.stderr)
        os.chmod(out, 0o600)
        os.replace(out, target)  # one rename: never half a file under the final name
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if path is None:  # older versions of the same request (another quantizer build, say)
        for old in target.parent.glob(f"{label}-*.gguf"):
            if old != target and old.name.startswith(f"{label}-{actual}-"):
                old.unlink(missing_ok=True)
    print(f"big_gguf: {target} ({target.stat().st_size / 1e9:.2f} GB) made in "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return target


def _llama_quantize(binary: Path, src: Path, out: Path, quant: str, log_path: Path) -> None:
    threads = str(os.cpu_count() or 1)
    with open(log_path, "wb") as log:
        try:
            subprocess.run([str(binary), str(src), str(out), quant, threads], stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=_QUANTIZE_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            log.flush()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama-quantize failed ({e!r}):\n{tail}") from None


def big_model_name(quant: str = "Q4_K_M", build: bool = True) -> str:
    """The path of the cached ~1B llama GGUF (built on first use, minutes) as the benches'
    --model takes it; `build=False` raises FileNotFoundError instead of building."""
    if not build:
        from forkv.engine.paths import cache_root

        found = sorted((cache_root() / "bench").glob("llama-1b-*.gguf"),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        wanted = [p for p in found if p.name.startswith((f"llama-1b-{quant}-",
                                                         f"llama-1b-{fallback_type(quant)}-"))]
        if not wanted:
            raise FileNotFoundError("no ~1B llama GGUF built yet; run "
                                    "`python -m forkv.bench.big_gguf` once.")
        return str(wanted[0])
    return str(make_llama_1b_gguf(quant=quant))


# -- one side-by-side measurement ---------------------------------------------------------------
def _no_eos_bias(gguf_path: str) -> dict[str, float]:
    from forkv.engine.models.gguf import read_gguf_metadata

    meta = read_gguf_metadata(gguf_path)
    tokens = meta.get("tokenizer.ggml.tokens") or []
    ids = {meta.get("tokenizer.ggml.eos_token_id")}
    ids |= {i for i, t in enumerate(tokens) if t in ("<|im_end|>", "<|endoftext|>", "</s>")}
    return {str(i): -100.0 for i in sorted(i for i in ids if i is not None)}


def _texts(gguf_path: str):
    """`Texts` (serve_cases' exact-length filler) on the file's tokenizer, as forkv converted it."""
    from forkv.engine.models.gguf_cache import converted_folder
    from forkv.engine.models.loader import wants_quantized_gguf
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from .serve_cases import Texts

    folder, _ = converted_folder(Path(gguf_path), quantized=wants_quantized_gguf("auto"))
    return Texts(load_tokenizer(folder), seed=512)


def _round(client, model: str, prompt: str, write: str, decode_tokens: int,
           no_eos: dict) -> dict:
    """One round on one server: a fresh prompt read (prefill tok/s = tokens computed / time
    to first token), then `decode_tokens` greedy tokens with end-of-sequence suppressed
    (decode tok/s on the client's clock)."""
    from .serve_procs import timed_chat

    read = timed_chat(client, model, [{"role": "user", "content": prompt}], 1)
    gen = timed_chat(client, model, [{"role": "user", "content": write}], decode_tokens,
                     extra={"logit_bias": no_eos})
    computed = read.computed_tokens or 0
    return {"prefill_tokens_per_s": computed / read.ttft_s if read.ttft_s else None,
            "prefill_tokens": computed, "prompt_tokens": read.prompt_tokens,
            "decode_tokens_per_s": gen.decode_tps or None, "decode_tokens": gen.completion_tokens,
            "server_prefill_tokens_per_s": read.server_prompt_tps,
            "server_decode_tokens_per_s": gen.server_decode_tps, "text_head": gen.text[:80]}


def _medians(rounds: list[dict]) -> dict:
    """A side's figures: the median of its rounds (each round's beside it)."""
    out = dict(rounds[-1])
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "server_prefill_tokens_per_s",
                "server_decode_tokens_per_s"):
        values = [r[key] for r in rounds if r[key]]
        out[key] = round(statistics.median(values), 2) if values else None
        if key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            out[f"{key}_rounds"] = [round(v, 2) if v else None for v in (r[key] for r in rounds)]
    return out


def _ready(server, timeout_s: float):
    """`server` once it answers (stopped, and the error raised, if it does not)."""
    try:
        server.wait_ready(timeout=timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def measure_side_by_side(path: str | None = None, prompt_tokens: int = 512,
                         decode_tokens: int = 128, llama_ctx: int = 8192,
                         timeout_s: float = 1800, rounds: int = 3) -> dict:
    """forkv serve and llama-server on the same GGUF (default: `big_model_name()`), both up
    at once and measured alike through the openai client in `rounds` rounds, the side that
    goes first alternating (a shared machine's speed drifts by tens of percent from minute to
    minute: alternating rounds put both sides in the same minutes). A round: a fresh
    ~`prompt_tokens`-token prompt, then `decode_tokens` greedy tokens (`_round`); each
    figure is the median of its rounds. Peak RSS: each server's own process, over the run.
    llama-server's own timings come along as server_*; it runs with -c `llama_ctx`."""
    import openai

    from .llamacpp import llama_server_path, repack_crashes, start_llama_server
    from .serve_procs import start_forkv, timed_chat

    path = path or big_model_name()
    no_eos = _no_eos_bias(path)
    notes = []
    t0 = time.perf_counter()
    _ready(start_forkv(path), timeout_s).stop()  # converts the file into forkv's cache
    first_start_s = time.perf_counter() - t0
    texts = _texts(path)  # the conversion is there now
    # Each round's texts, the same for both sides (the chat template adds ~30 tokens)
    plan = [("Read this. " + texts(prompt_tokens - 30), "Write on. " + texts(16))
            for _ in range(rounds)]
    binary = llama_server_path()
    no_repack = repack_crashes(binary, path)
    if no_repack:
        notes.append("llama-server segfaults at start with weight repacking on this CPU: it "
                     "ran with --no-repack.")
    servers, ready = {}, {}
    old = os.environ.get("LLAMA_ARG_CTX_SIZE")
    os.environ["LLAMA_ARG_CTX_SIZE"] = str(llama_ctx)  # llama-server's -c, read at its start
    try:
        # Measured: forkv's second start, which finds the conversion cached (the first one's
        # peak RSS is the converter's, once per file, not the server's).
        for side, start in (("forkv", lambda: start_forkv(path)),
                            ("llama_server", lambda: start_llama_server(binary, path))):
            t = time.perf_counter()
            servers[side] = _ready(start(), timeout_s)
            ready[side] = round(time.perf_counter() - t, 1)
        clients = {side: openai.OpenAI(base_url=s.base_url, api_key="bench", max_retries=0,
                                       timeout=timeout_s) for side, s in servers.items()}
        for side, s in servers.items():
            timed_chat(clients[side], s.model, [{"role": "user", "content": "warm up"}], 4)
        results = {side: [] for side in servers}
        for r, (prompt, write) in enumerate(plan):
            for side in (("forkv", "llama_server") if r % 2 == 0
                         else ("llama_server", "forkv")):
                results[side].append(_round(clients[side], servers[side].model, prompt, write,
                                            decode_tokens, no_eos))
        rows = {}
        for side, s in servers.items():
            rows[side] = _medians(results[side])
            rows[side].update(ready_s=ready[side], peak_rss_mib=s.peak_rss_mib(),
                              huge_pages_mib=s.huge_pages_mib())
    finally:
        for s in servers.values():
            s.stop()
        if old is None:
            os.environ.pop("LLAMA_ARG_CTX_SIZE", None)
        else:
            os.environ["LLAMA_ARG_CTX_SIZE"] = old
    rows["forkv"]["first_start_s"] = round(first_start_s, 1)

    def ratio(key):
        a, b = rows["forkv"].get(key), rows["llama_server"].get(key)
        return round(a / b, 3) if a and b else None
    return {"model": path, "size_gb": round(Path(path).stat().st_size / 1e9, 3),
            "cpus": os.cpu_count(), "rounds": rounds, "sides": rows,
            "prefill_ratio": ratio("prefill_tokens_per_s"),
            "decode_ratio": ratio("decode_tokens_per_s"), "notes": notes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forkv.bench.big_gguf",
                                description="Build (once) the random-weights ~1B llama GGUF and "
                                            "print its path; --measure compares forkv serve "
                                            "with llama-server on it.")
    p.add_argument("--quant", default="Q4_K_M", help="llama-quantize type (default Q4_K_M)")
    p.add_argument("--quantizer", default="auto", choices=("auto", "llama", "gguf"))
    p.add_argument("--measure", action="store_true", help="prefill and decode, both sides")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating rounds, both servers up at once (default 3)")
    args = p.parse_args(argv)
    path = make_llama_1b_gguf(quant=args.quant, quantizer=args.quantizer)
    print(path)
    if args.measure:
        print(json.dumps(measure_side_by_side(str(path), args.prompt_tokens,
                                              args.decode_tokens, rounds=args.rounds),
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
