"""`forkv bench kv`: each cached K/V format (float16, bfloat16, q8_0, float32) on one model: the
perplexity of a fixed long passage, the K/V bytes per cached token, prefill and decode speed.

The passage is Python's own language reference (`pydoc_data.topics`, fixed for a Python
release: prose and code), its topics in sorted order, cut to `passage_tokens` tokens. Each
format loads the model on its own (`load_model(kv_dtype=...)`, forkv's kernels on the CPU,
which read half and q8_0 K/V directly) and prefills the passage in block-sized chunks, as the engine
does, each chunk attending to the K/V the cache stored: perplexity = exp(mean negative log
likelihood of every next token). Speed: a timed prefill of the passage (logits not computed,
as in a server's prefill), then `gen_tokens` greedy decode steps at that context; formats
interleave rep by rep and the median is reported. The headline is each narrow format's
perplexity over float32's (targets: the default within 0.5%, q8_0 within 1%).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time

from .common import result

FORMATS = ("float16", "bfloat16", "q8_0", "float32")
DEFAULT_MODEL = "gemma3-270m"


def passage_text() -> str:
    """The fixed passage: Python's language reference topics, sorted by name."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def run_kv_bench(model: str = DEFAULT_MODEL, quick: bool = False, reps: int = 2,
                 passage_tokens: int = 4096, gen_tokens: int = 32, block: int = 256,
                 formats: tuple[str, ...] = FORMATS) -> dict:
    """Perplexity, K/V bytes per token, prefill and decode tok/s per cached K/V format."""
    from forkv.engine.models import blas

    blas.activate()
    if quick:
        reps, passage_tokens, gen_tokens = 1, 300, 4
    load_before = [round(x, 2) for x in os.getloadavg()]
    from forkv.engine import load_model
    from forkv.engine.native.kvcache import bytes_per_token

    loaded = {f: load_model(model, kv_dtype=f) for f in formats}
    text = passage_text()[:passage_tokens * 8]  # ample: a token is 3-5 characters here
    tokens = loaded[formats[0]].tokenizer.encode(text)[:passage_tokens]
    cases = []
    for f in formats:
        lm = loaded[f]
        ppl = _perplexity(lm, tokens, block)
        cases.append({"kv_dtype": lm.kv_dtype, "perplexity": round(ppl, 4),
                      "kv_bytes_per_token": bytes_per_token(lm.model, lm.make_cache()),
                      "fingerprint": lm.fingerprint.hex()[:16], "prefill_tok_s": [],
                      "decode_tok_s": []})
        gc.collect()
    for _ in range(reps):
        for f, case in zip(formats, cases):
            prefill_s, decode_s = _speed(loaded[f], tokens, block, gen_tokens)
            case["prefill_tok_s"].append(round(len(tokens) / prefill_s, 1))
            case["decode_tok_s"].append(round((gen_tokens - 1) / decode_s, 1))
    for case in cases:
        for key in ("prefill_tok_s", "decode_tok_s"):
            case[key] = statistics.median(case[key])
    by = {c["kv_dtype"]: c for c in cases}
    base = by.get("float32")
    headline = {}
    for f in ("float16", "bfloat16", "q8_0"):
        if f in by and base:
            headline[f"{f}_ppl_vs_float32"] = round(by[f]["perplexity"] / base["perplexity"], 5)
            headline[f"{f}_decode_vs_float32"] = round(
                by[f]["decode_tok_s"] / base["decode_tok_s"], 3)
            headline[f"{f}_prefill_vs_float32"] = round(
                by[f]["prefill_tok_s"] / base["prefill_tok_s"], 3)
    from forkv.engine.native import DEFAULT_KV_DTYPE

    targets = {f"{DEFAULT_KV_DTYPE}_ppl_vs_float32": "<= 1.005", "q8_0_ppl_vs_float32": "<= 1.01"}
    settings = {"passage": "pydoc_data.topics (sorted)", "passage_tokens": len(tokens),
                "block": block, "gen_tokens": gen_tokens, "reps": reps,
                "default_kv_dtype": DEFAULT_KV_DTYPE, "loadavg_before": load_before}
    return result("kv", model, settings, cases, headline, targets, notes=[
        "perplexity: chunks of `block` tokens, each attending to the K/V its cache stored; "
        "speed: median over reps, formats interleaved"])


def _perplexity(lm, tokens: list[int], block: int) -> float:
    import mlx.core as mx

    cache = lm.make_cache()
    nll, count = 0.0, 0
    for start in range(0, len(tokens) - 1, block):
        chunk = tokens[start:start + block]
        logits = lm.model(mx.array([chunk]), cache=cache)[0].astype(mx.float32)
        targets = tokens[start + 1:start + 1 + len(chunk)]
        logits = logits[:len(targets)]
        lse = mx.logsumexp(logits, axis=-1)
        picked = mx.take_along_axis(logits, mx.array(targets)[:, None], axis=-1)[:, 0]
        nll += (lse - picked).sum().item()
        count += len(targets)
    return math.exp(nll / count)


def _speed(lm, tokens: list[int], block: int, gen_tokens: int) -> tuple[float, float]:
    import mlx.core as mx

    cache = lm.make_cache()
    t0 = time.perf_counter()
    for start in range(0, len(tokens), block):
        lm.model(mx.array([tokens[start:start + block]]), cache=cache)
        mx.eval([c.state for c in cache])
    prefill_s = time.perf_counter() - t0
    y = mx.array([[tokens[-1]]])
    t0 = None
    for i in range(gen_tokens):
        y = mx.argmax(lm.model(y, cache=cache)[:, -1:], axis=-1)
        mx.eval(y)
        if i == 0:
            t0 = time.perf_counter()
    return prefill_s, time.perf_counter() - t0

