"""`forkv bench rewind`: time to first token after rewinding to an N-token prefix.

A conversation of N+300 tokens is computed once. Then, for each N, a new 64-token message is
appended to the first N tokens: forkv restores the prefix from its block checkpoints; the
baseline is plain mlx-lm generation with mlx-lm's own prompt-cache reuse where it really
applies: its cache of the conversation is trimmed back to N when every layer's cache (each
child of a `CacheList` too) trims exactly that many tokens; otherwise (state caches, a wrapped
sliding window, a chunked cache asked to go back past its chunk) the rewind is a full
recompute. Ours and the baseline alternate, rep by rep.
"""

from __future__ import annotations

import time

from .common import random_tokens, result, summary, timed

MESSAGE = 64


def _baseline(model, tokenizer, prompt: list[int], cache) -> float:
    """Seconds to the first token with mlx-lm's stream_generate."""
    from mlx_lm.generate import stream_generate

    t0 = time.perf_counter()
    for _ in stream_generate(model, tokenizer, prompt, max_tokens=1, prompt_cache=cache):
        break
    return time.perf_counter() - t0


def _leaves(cache: list) -> list:
    """The caches that hold tokens: each layer's, or each child of a CacheList."""
    return [leaf for c in cache for leaf in (getattr(c, "caches", None) or [c])]


def _trim_back(cache: list, n: int) -> bool:
    """Trim mlx-lm's cache back to its first n tokens if every layer's trim lands there;
    False (the cache is then unusable) when one cannot, so the caller recomputes."""
    leaves = _leaves(cache)
    if not all(c.is_trimmable() for c in leaves):
        return False
    excess = max(c.offset for c in leaves) - n
    trimmed = [c.trim(excess) for c in leaves]  # every layer, even after one falls short
    return all(t == excess for t in trimmed) and all(c.offset == n for c in leaves)


def run_rewind_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 3,
                     sizes: tuple[int, ...] | None = None, baseline_reps: int = 1) -> dict:
    """`reps` restores per prefix length; the baseline (a full recompute of up to 8K tokens,
    a minute or more on a 2-core CPU, and steady to a few percent) runs in the first
    `baseline_reps` of them, interleaved with ours."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from forkv.engine import Engine, load_model

    if quick:
        reps, sizes = 1, (256, 512)
    sizes = tuple(sorted(sizes or (512, 2048, 8192), reverse=True))
    lm = load_model(model)
    engine = Engine(lm)
    history = random_tokens(sizes[0] + 300, seed=1)
    t_history, _ = timed(lambda: engine.generate(history, max_tokens=1))
    engine.store.flush()
    # The baseline's own cache of the whole conversation, trimmed back per rewind where the
    # trim lands. A rotating (sliding-window) cache stops being trimmable once it wraps, as it
    # has after 8K tokens, and state caches never are: such a baseline recomputes every rewind
    # (and is not filled with the conversation for nothing).
    base_cache = make_prompt_cache(lm.model)
    leaves = _leaves(base_cache)
    wraps = any(len(history) >= getattr(c, "max_size", len(history) + 1) for c in leaves)
    if all(c.is_trimmable() for c in leaves) and not wraps:
        _baseline(lm.model, lm.tokenizer, history, base_cache)
    else:
        base_cache = None  # every rewind is a full recompute
    cases, modes = [], []
    for n in sizes:
        ours, base, restore_s, reused = [], [], [], []
        mode = "recompute"
        for r in range(reps):
            prompt = history[:n] + random_tokens(MESSAGE, seed=1000 * n + r)
            t, out = timed(lambda: engine.generate(prompt, max_tokens=1))
            ours.append(t)
            restore_s.append(out.timings.restore_s)
            reused.append(out.timings.reused_tokens)
            if r >= baseline_reps:
                continue
            if base_cache is not None and not _trim_back(base_cache, n):
                base_cache = None  # this trim would not land: recompute from here on
            mode = "trim" if base_cache is not None else "recompute"
            base.append(_baseline(lm.model, lm.tokenizer, prompt, base_cache))  # None: recompute
            mx.clear_cache()
        modes.append(mode)
        cases.append({"prefix_tokens": n, "message_tokens": MESSAGE, "baseline_mode": mode,
                      "ours_ttft_s": summary(ours),
                      "baseline_ttft_s": summary(base), "restore_s": summary(restore_s),
                      "reused_tokens": reused[0],
                      "speedup": summary([b / o for b, o in zip(base, ours)])})
    exact, read = _exactness(engine, lm, history, sizes[0])
    top = cases[0]
    speedup = round(top["baseline_ttft_s"]["median"] / top["ours_ttft_s"]["median"], 2)
    headline = {
        "speedup_8k": speedup if sizes[0] == 8192 else None,
        "speedup_at_max": speedup, "max_prefix_tokens": sizes[0],
        "exact": exact["exact"],
        "restore_over_read": round(read["restore_s"] / max(read["read_s"], 1e-9), 2),
    }
    engine.close()
    return result(
        "rewind", model,
        {"sizes": list(sizes), "reps": reps, "baseline_reps": baseline_reps,
         "block_size": engine.block_size,
         "baseline": "mlx-lm stream_generate, " + (
             "prompt cache trimmed back to the prefix" if set(modes) == {"trim"}
             else "full recompute (the cache's trim does not land)" if set(modes) == {"recompute"}
             else "prompt cache trimmed back where the trim lands, else a full recompute"),
         "history_prefill_s": round(t_history, 2), "layout": lm.layout.describe()},
        cases, headline, {"speedup_8k": ">= 20", "exact": "== true", "restore_over_read": "<= 2"},
        notes=[f"exactness: {exact}", f"record read: {read}"], dtype=lm.dtype)


def _exactness(engine, lm, history, n) -> tuple[dict, dict]:
    """Greedy tokens after a restore vs a fresh block-aligned run; and the time to read the
    restored records' bytes (through the tiers, decrypting) without rebuilding caches."""
    from forkv.engine import Engine
    from forkv.engine.cache.layout import CacheKind

    prompt = history[:n] + random_tokens(MESSAGE, seed=7)
    restored = engine.generate(prompt, max_tokens=8)
    fresh = Engine(lm, checkpoints=False).generate(prompt, max_tokens=8)
    ck, B = engine.checkpointer, engine.block_size
    keys = ck.keyer.keys(prompt)
    k = restored.timings.reused_tokens // B
    wanted = [(keys[b], kind) for kind in sorted(ck.kinds - {CacheKind.EXTRA})
              for b in lm.layout.blocks(kind, k * B, B)]
    t, records = timed(lambda: [engine.store.get(key, kind) for key, kind in wanted])
    nbytes = sum(r.nbytes for r in records if r is not None)
    return ({"exact": restored.token_ids == fresh.token_ids,
             "restored_tokens": restored.token_ids, "fresh_tokens": fresh.token_ids,
             "reused_tokens": restored.timings.reused_tokens},
            {"records": len(wanted), "bytes": nbytes, "read_s": t,
             "restore_s": restored.timings.restore_s})
