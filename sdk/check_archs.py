"""`forkv check-archs`: is every mlx-lm architecture checkpointed, exactly and with reuse?

For each architecture of the installed mlx-lm whose `make_cache()` returns anything but plain
`KVCache` (sliding windows, SSM / linear-attention / conv state, hybrids, `CacheList`, chunked
attention, ...), build a tiny model with random weights (forkv.arch_configs), then:
- prefill a prompt and decode past a block boundary with the checkpoint recorder on;
- for boundaries recorded in prefill and in decode, restore the prefix, prefill a new
  continuation, and compare the logprobs of the last chunk with plain mlx-lm prefilling the
  whole sequence from scratch in chunks ending at absolute multiples of the block size:
  they must be bit-identical, and the restore must reuse > 0 tokens.
Architectures plain mlx-lm cannot run on this device (a Metal-only kernel off a Mac) are
listed as skipped, with the reason.
Knows the check; the configurations live in arch_configs.py.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field

from .arch_configs import CONFIGS, QUANTIZED

BLOCK = 256  # the block size of the exactness contract
PROMPT = 700  # tokens prefilled: boundaries 256 and 512 are recorded in prefill
DECODE_TO = 770  # decode until the sequence holds this many: boundary 768 is recorded in decode
CUTS = (256, 512, 768)
CONTINUATION = 24  # new tokens after each restored prefix


@dataclass(slots=True)
class ArchResult:
    arch: str
    status: str  # "exact", "skipped" or "failed"
    reason: str = ""
    caches: str = ""  # the leaf cache classes of make_cache(), with their record kinds
    quantized: bool = False
    windows: list[int] = field(default_factory=list)  # sizes of window / chunked caches
    reused: list[int] = field(default_factory=list)  # tokens restored at each cut
    seconds: float = 0.0


def installed_architectures() -> list[str]:
    """Modules of the installed mlx-lm whose `make_cache()` builds a cache class other than
    `KVCache`, directly or through the model they wrap or subclass (read from the source:
    building every model to find out would take minutes)."""
    import pathlib
    import re

    import mlx_lm

    root = pathlib.Path(mlx_lm.__file__).parent / "models"
    sources = {p.stem: p.read_text() for p in root.glob("*.py")
               if p.stem not in ("__init__", "base", "cache")}
    found, wraps = set(), {}
    for name, text in sources.items():
        bodies = re.findall(r"^([ \t]*)(def make_cache\(.*?)(?=\n\1(?:def |@)|\n\S|\Z)",
                            text, re.DOTALL | re.MULTILINE)
        for _, body in bodies:
            if set(re.findall(r"\b(\w*Cache\w*)\(", body)) - {"KVCache"}:
                found.add(name)
        if any(".make_cache()" in body for _, body in bodies):  # delegates to what it imports
            wraps[name] = set(re.findall(r"from \.(\w+) import", text)) | {
                m.strip() for group in re.findall(r"from \. import ([\w, ]+)", text)
                for m in group.split(",")}
        elif not bodies:  # a Model subclassing another module's Model inherits its caches
            parents = re.findall(r"^class Model\((\w+)\.Model\)", text, re.MULTILINE)
            for alias in re.findall(r"^class Model\((\w+)\)", text, re.MULTILINE):
                parents += re.findall(rf"from \.(\w+) import Model as {alias}\b", text)
            wraps[name] = set(parents)
    while True:
        more = {name for name, mods in wraps.items() if mods & found} - found
        if not more:
            return sorted(found)
        found |= more


def architectures() -> list[str]:
    """The architectures checked: the installed ones, and any other arch_configs lists."""
    return sorted(set(installed_architectures()) | set(CONFIGS))


def mlx_lm_version() -> str:
    import mlx_lm

    return mlx_lm.__version__


def build(arch: str, quantize: bool = False):
    """A tiny random-weight LoadedModel of `arch` (float32; 4-bit weights if `quantize`)."""
    import hashlib
    import importlib

    import mlx.core as mx
    from forkv.engine.cache.layout import cache_layout
    from forkv.engine.models.loader import LoadedModel
    from mlx import nn
    from mlx.utils import tree_map
    from mlx_lm.models.cache import make_prompt_cache

    config = CONFIGS[arch]
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(sum(map(ord, arch)))
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: p.astype(mx.float32)
                          if mx.issubdtype(p.dtype, mx.floating) else p, model.parameters()))
    if quantize:
        nn.quantize(model, group_size=32, bits=4,
                    class_predicate=lambda _, m: hasattr(m, "to_quantized")
                    and m.weight.shape[-1] % 32 == 0)
    mx.eval(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unknown cache class is reported as a failure
        layout = cache_layout(make_prompt_cache(model))
    digest = hashlib.sha256(json.dumps([arch, quantize, config], sort_keys=True).encode())
    return LoadedModel(name=f"tiny:{arch}", path=None, model=model, tokenizer=None,
                       config=config, dtype="float32", layout=layout,
                       fingerprint=digest.digest(), context_length=4096)


def vocab_size(config: dict) -> int:
    return config.get("vocab_size") or config["text_config"]["vocab_size"]


def _tokens(n: int, seed: int, vocab: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _prefill(model, cache, tokens, start: int, hook=None):
    """mlx-lm's forward in chunks ending at every multiple of BLOCK; the last chunk's
    logprobs. `hook(pos, tokens[:pos], cache, False)` runs at each boundary."""
    import mlx.core as mx

    ends = list(range((start // BLOCK + 1) * BLOCK, len(tokens), BLOCK)) + [len(tokens)]
    pos = start
    for end in ends:
        logits = model(mx.array(tokens[pos:end])[None], cache=cache)
        mx.eval(logits, [c.state for c in cache])
        pos = end
        if hook is not None and end % BLOCK == 0:
            hook(end, tokens[:end], cache, False)
    return logits[0] - mx.logsumexp(logits[0], axis=-1, keepdims=True)


def _record_history(lm, ck, prompt: list[int]) -> list[int]:
    """Prefill `prompt` and decode greedily to DECODE_TO tokens, recording every boundary."""
    import mlx.core as mx

    restored = ck.restore(prompt)
    hook = ck.recorder(restored.keys)
    logprobs = _prefill(lm.model, restored.cache, prompt, restored.position, hook)
    cache, seq = restored.cache, list(prompt)
    while len(seq) < DECODE_TO:
        seq.append(int(mx.argmax(logprobs[-1]).item()))
        logprobs = lm.model(mx.array([[seq[-1]]]), cache=cache)[0]
        mx.eval(logprobs, [c.state for c in cache])
        if len(seq) % BLOCK == 0:
            hook(len(seq), seq, cache, True)
    return seq


def check(arch: str, quantize: bool = False) -> ArchResult:
    """Build `arch` tiny and check reuse and exactness (see the module docstring)."""
    import mlx.core as mx
    from forkv.engine.cache.checkpoint import Checkpointer
    from forkv.engine.cache.recordstore import RecordStore

    t0 = time.perf_counter()
    result = ArchResult(arch, "failed", quantized=quantize)
    if arch not in CONFIGS:
        result.reason = "no tiny configuration in forkv.arch_configs (new in this mlx-lm?)"
        return result
    lm = build(arch, quantize)
    try:
        _prefill(lm.model, lm.make_cache(), [0, 1, 2], 0)
    except RuntimeError as e:
        if "Metal" not in str(e):
            raise
        result.status = "skipped"
        result.reason = f"plain mlx-lm cannot run it on this device: {e}"
        return result
    result.caches = ", ".join(sorted({f"{l.cache_class}:{l.kind}" for l in lm.layout.layers}))
    result.windows = sorted({l.window for l in lm.layout.layers if l.window})
    if not lm.layout.can_checkpoint:
        result.reason = f"forkv does not know cache class {result.caches}"
        return result
    vocab = vocab_size(CONFIGS[arch])
    ck = Checkpointer(lm, RecordStore(1 << 30, None, BLOCK), BLOCK)
    history = _record_history(lm, ck, _tokens(PROMPT, 1, vocab))
    for cut in CUTS:
        tokens = history[:cut] + _tokens(CONTINUATION, cut, vocab)
        restored = ck.restore(tokens)
        result.reused.append(restored.position)
        got = _prefill(lm.model, restored.cache, tokens, restored.position)
        want = _prefill(lm.model, lm.make_cache(), tokens, 0)
        if not mx.all(mx.isfinite(want)).item():
            result.reason = "plain mlx-lm gives non-finite logprobs with random weights"
            return result
        if restored.position != cut:
            result.reason = f"restored {restored.position} tokens at boundary {cut}"
            return result
        if not mx.array_equal(got, want).item():
            diff = mx.max(mx.abs(got - want)).item()
            result.reason = f"logprobs differ after restoring {cut} tokens (max {diff:.3g})"
            return result
    result.status, result.seconds = "exact", time.perf_counter() - t0
    return result


def check_all(archs: list[str] | None = None) -> list[ArchResult]:
    out = []
    for arch in archs or architectures():
        for quantize in (False, True) if arch in QUANTIZED else (False,):
            t0 = time.perf_counter()
            try:
                result = check(arch, quantize)
            except Exception as e:  # noqa: BLE001 - a model that cannot run is reported
                result = ArchResult(arch, "failed", f"{type(e).__name__}: {e}", quantized=quantize)
            result.seconds = round(time.perf_counter() - t0, 2)
            out.append(result)
    return out


def summary(results: list[ArchResult]) -> str:
    """"exact with reuse on N of M architectures of mlx-lm X.Y" (M counts each arch once)."""
    archs = {r.arch for r in results}
    bad = {r.arch for r in results if r.status != "exact"}
    return (f"exact with reuse on {len(archs - bad)} of {len(archs)} architectures of "
            f"mlx-lm {mlx_lm_version()}")


def format_table(results: list[ArchResult]) -> str:
    rows = [("architecture", "weights", "result", "caches / reason")]
    for r in results:
        rows.append((r.arch, "4-bit" if r.quantized else "fp32", r.status,
                     r.reason if r.status != "exact" else r.caches))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], width)) + "  " + row[3]
             for row in rows]
    return "\n".join(lines + ["", summary(results)])


def run_cli(args) -> int:
    results = check_all(args.arch or None)
    if args.json:
        print(json.dumps({"mlx_lm": mlx_lm_version(), "summary": summary(results),
                          "results": [asdict(r) for r in results]}, indent=1))
    else:
        print(format_table(results))
    return 0 if all(r.status != "failed" for r in results) else 1
