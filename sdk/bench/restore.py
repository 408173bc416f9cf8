"""`forkv bench restore`: where a long restore's time goes, against the raw read of its records.

One conversation of `tokens` tokens is prefilled once (its blocks and its turn end recorded),
then the next turn's prompt is restored `reps` times through the engine's own checkpointer,
timing separately the record reads (the store's `get`: RAM tier arrays, or the disk tier's
read, decryption and decoding), the building of the caches from them (concatenations, ring
copies) and everything else (keys, verification); then the few new tokens are prefilled on the
restored cache. Headline: `restore_vs_read` (median restore ÷ median raw read of the same
records; target <= 2), and the split in milliseconds. The first prefill is not timed.
"""

from __future__ import annotations

import random
import statistics
import time

from .common import result

__all__ = ["run_restore_bench"]

TARGETS = {"restore_vs_read": "<= 2"}
_WORDS = ("river", "stone", "lamp", "orbit", "cedar", "quartz", "meadow", "signal", "harbor")


def run_restore_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 7,
                      tokens: int = 12000) -> dict:
    """The split of a `tokens`-token restore on `model`, medians over `reps` restores."""
    from forkv.engine import blas

    blas.activate()
    import mlx.core as mx

    from forkv.engine import Engine, load_model
    from forkv.engine import partial as partial_mod

    if quick:
        tokens, reps = min(tokens, 1500), min(reps, 3)
    lm = load_model(model)
    engine = Engine(lm)
    try:
        tok, rng = lm.tokenizer, random.Random(0)
        words = " ".join(rng.choice(_WORDS) for _ in range(tokens * 2))
        doc = tok.decode(tok.encode(words, add_special_tokens=False)[:tokens])
        first = [{"role": "user", "content": doc}]
        engine.generate(first, max_tokens=1)
        engine.drain()
        ck = engine.checkpointer
        prompt = engine.encode(first + [{"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": "next question"}])
        spent = {"read": 0.0, "build": 0.0}
        store_get, build = ck.store.get, partial_mod.build

        def timed_get(key, kind):
            t = time.perf_counter()
            try:
                return store_get(key, kind)
            finally:
                spent["read"] += time.perf_counter() - t

        def timed_build(*a, **k):
            t = time.perf_counter()
            try:
                return build(*a, **k)
            finally:
                spent["build"] += time.perf_counter() - t

        rows = []
        ck.store.get, partial_mod.build = timed_get, timed_build
        try:
            for _ in range(reps):
                spent.update(read=0.0, build=0.0)
                t0 = time.perf_counter()
                r = ck.restore_run(prompt, count=False)
                mx.eval([c.state for c in r.cache])
                total = time.perf_counter() - t0
                t1 = time.perf_counter()
                logits = lm.model(mx.array(prompt[r.position:])[None], cache=r.cache)
                mx.eval(logits)
                rows.append({"restored_tokens": r.position, "restore_ms": total * 1e3,
                             "read_ms": spent["read"] * 1e3, "build_ms": spent["build"] * 1e3,
                             "other_ms": (total - spent["read"] - spent["build"]) * 1e3,
                             "new_tokens": len(prompt) - r.position,
                             "prefill_ms": (time.perf_counter() - t1) * 1e3})
        finally:
            ck.store.get, partial_mod.build = store_get, build
        med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
        headline = {"restore_ms": med["restore_ms"], "read_ms": med["read_ms"],
                    "build_ms": med["build_ms"], "other_ms": med["other_ms"],
                    "prefill_after_ms": med["prefill_ms"],
                    "restore_vs_read": round(statistics.median(r["restore_ms"] / r["read_ms"]
                                                               for r in rows), 3),
                    "restored_tokens": rows[0]["restored_tokens"]}
        stats = engine.stats()
        notes = [f"Records in RAM: {stats['ram']['records']} ({stats['ram']['bytes']} bytes); "
                 f"on disk: {stats.get('disk', {}).get('records', 0)} (window rings and turn "
                 "ends are read from the encrypted disk tier once the RAM tier keeps only "
                 "global records).",
                 "read = the store's get of every record the restore reads; build = the "
                 "caches made from them; other = keys, verification, lookups."]
        return result("restore", model, {"tokens": tokens, "reps": reps}, rows, headline,
                      TARGETS, notes, dtype=str(getattr(lm, "dtype", "")) or None)
    finally:
        engine.close()
