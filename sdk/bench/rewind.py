"""`forkv bench rewind`: time to first token after rewinding to an N-token prefix.

A conversation of N+300 tokens is computed once. Then, for each N, a new 64-token message is
appended to the first N tokens: forkv restores the prefix from its block checkpoints; the
baseline is plain mlx-lm generation with mlx-lm's own prompt-cache reuse where it applies
(`trim_prompt_cache` back to N for trimmable caches; a full recompute for sliding-window and
hybrid caches, which cannot be trimmed back). Ours and the baseline alternate, rep by rep.
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


def run_rewind_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 3,
                     sizes: tuple[int, ...] | None = None, baseline_reps: int = 1) -> dict:
    """`reps` restores per prefix length; the baseline (a full recompute of up to 8K tokens,
    a minute or more on a 2-core CPU, and steady to a few percent) runs in the first
    `baseline_reps` of them, interleaved with ours."""
    import mlx.core as mx
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

    from forkv.engine import Engine, load_model

    if quick:
        reps, sizes = 1, (256, 512)
    sizes = tuple(sorted(sizes or (512, 2048, 8192), reverse=True))
    lm = load_model(model)
    engine = Engine(lm)
    history = random_tokens(sizes[0] + 300, seed=1)
    t_history, _ = timed(lambda: engine.generate(history, max_tokens=1))
    engine.store.flush()
    # The baseline's own cache of the whole conversation, trimmed back per rewind if it can be.
    # A rotating (sliding-window) cache stops being trimmable once it wraps, as it has after
    # 8K tokens: such a baseline recomputes every rewind (before, it was fed the prompt on top
    # of the untrimmed conversation, which overstated its time).
    base_cache = make_prompt_cache(lm.model)
    wraps = any(len(history) >= getattr(c, "max_size", len(history) + 1) for c in base_cache)
    if can_trim_prompt_cache(base_cache) and not wraps:
        _baseline(lm.model, lm.tokenizer, history, base_cache)
    trimmable = can_trim_prompt_cache(base_cache) and base_cache[0].offset > 0
    if not trimmable:
        base_cache = None  # every rewind is a full recompute
    cases = []
    for n in sizes:
        ours, base, restore_s, reused = [], [], [], []
        for r in range(reps):
            prompt = history[:n] + random_tokens(MESSAGE, seed=1000 * n + r)
            t, out = timed(lambda: engine.generate(prompt, max_tokens=1))
            ours.append(t)
            restore_s.append(out.timings.restore_s)
            reused.append(out.timings.reused_tokens)
            if r >= baseline_reps:
                continue
            if trimmable:
                trimmed = trim_prompt_cache(base_cache, base_cache[0].offset - n)
                assert base_cache[0].offset == n, (trimmed, base_cache[0].offset, n)
            base.append(_baseline(lm.model, lm.tokenizer, prompt, base_cache))  # None: recompute
            mx.clear_cache()
        cases.append({"prefix_tokens": n, "message_tokens": MESSAGE, "ours_ttft_s": summary(ours),
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
             "prompt cache trimmed back to the prefix" if trimmable
             else "full recompute (cache not trimmable)"),
         "history_prefill_s": round(t_history, 2), "layout": lm.layout.describe()},
        cases, headline, {"speedup_8k": ">= 20", "exact": "== true", "restore_over_read": "<= 2"},
        notes=[f"exactness: {exact}", f"record read: {read}"], dtype=lm.dtype)


def _exactness(engine, lm, history, n) -> tuple[dict, dict]:
    """Greedy tokens after a restore vs a fresh block-aligned run; and the time to read the
    restored records' bytes (through the tiers, decrypting) without rebuilding caches."""
    from forkv.engine import Engine
    from forkv.engine.layout import CacheKind
    from forkv.engine.records import window_blocks

    prompt = history[:n] + random_tokens(MESSAGE, seed=7)
    restored = engine.generate(prompt, max_tokens=8)
    fresh = Engine(lm, checkpoints=False).generate(prompt, max_tokens=8)
    ck, B = engine.checkpointer, engine.block_size
    keys = ck.keyer.keys(prompt)
    k = restored.timings.reused_tokens // B
    wanted = [(keys[b], CacheKind.GLOBAL) for b in range(k) if CacheKind.GLOBAL in ck.kinds]
    wanted += [(keys[b], CacheKind.WINDOW) for b in window_blocks(lm.layout, k * B, B)]
    if CacheKind.STATE in ck.kinds and k:
        wanted.append((keys[k - 1], CacheKind.STATE))
    t, records = timed(lambda: [engine.store.get(key, kind) for key, kind in wanted])
    nbytes = sum(r.nbytes for r in records if r is not None)
    return ({"exact": restored.token_ids == fresh.token_ids,
             "restored_tokens": restored.token_ids, "fresh_tokens": fresh.token_ids,
             "reused_tokens": restored.timings.reused_tokens},
            {"records": len(wanted), "bytes": nbytes, "read_s": t,
             "restore_s": restored.timings.restore_s})
