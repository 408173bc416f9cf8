"""`forkv bench restore`: where a long restore's time goes, against the raw read of its records.

One conversation of `tokens` tokens is prefilled once (its blocks and its turn end recorded),
then the next turn's prompt is restored `reps` times through the engine's own checkpointer,
timing separately the record reads (the store's `get`: RAM tier arrays, or the disk tier's
read, decryption and decoding), the building of the caches from them (concatenations, ring
copies) and everything else (keys, verification); then the few new tokens are prefilled on the
restored cache. Headline: `restore_vs_read` (median restore ÷ median raw read of the same
records; target <= 2), and the split in milliseconds. `block_sizes=32,64,256` repeats it at
each block size — the exact reuse mode's grain — with what finer records cost: the first
prefill's speed in chunks that small, records and bytes per tier, the restore.
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
                      tokens: int = 12000, block_sizes: tuple[int, ...] = (256,)) -> dict:
    """The split of a `tokens`-token restore on `model`, medians over `reps` restores, for
    each of `block_sizes` (the exact mode's grain: what finer records cost to make and to
    read back)."""
    from forkv.engine.models import blas

    blas.activate()
    from forkv.engine import load_model

    if quick:
        tokens, reps = min(tokens, 1500), min(reps, 3)
    lm = load_model(model)
    rows, notes = [], []
    for block_size in block_sizes:
        rows.append(_one_grain(lm, tokens, reps, block_size, notes))
    first = rows[0]
    headline = {k: first[k] for k in ("restore_ms", "read_ms", "build_ms", "other_ms",
                                      "prefill_after_ms", "restore_vs_read",
                                      "restored_tokens")}
    if len(rows) > 1:
        for r in rows:
            b = r["block_size"]
            headline[f"grain_{b}_prefill_tps"] = r["first_prefill_tps"]
            headline[f"grain_{b}_records"] = r["records"]
            headline[f"grain_{b}_restore_ms"] = r["restore_ms"]
    notes.append("read = the store's get of every record the restore reads; build = the "
                 "caches made from them (partial.build at a turn end); other = keys, "
                 "verification, lookups. first_prefill_tps: the first, fresh prefill of the "
                 "conversation, in chunks of the block size.")
    return result("restore", model, {"tokens": tokens, "reps": reps,
                                      "block_sizes": list(block_sizes)},
                  rows, headline, TARGETS, notes, dtype=str(getattr(lm, "dtype", "")) or None)


def _one_grain(lm, tokens: int, reps: int, block_size: int, notes: list) -> dict:
    import mlx.core as mx

    from forkv.engine import Engine

    engine = Engine(lm, block_size=block_size)
    try:
        tok, rng = lm.tokenizer, random.Random(0)
        words = " ".join(rng.choice(_WORDS) for _ in range(tokens * 2))
        doc = tok.decode(tok.encode(words, add_special_tokens=False)[:tokens])
        first = [{"role": "user", "content": doc}]
        t0 = time.perf_counter()
        done = engine.generate(first, max_tokens=1)
        first_s = time.perf_counter() - t0
        engine.drain()
        ck = engine.checkpointer
        prompt = engine.encode(first + [{"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": "next question"}])
        runs = []
        for _ in range(reps):
            with ck.timed() as spent:  # the checkpointer's read and build seconds
                t0 = time.perf_counter()
                r = ck.restore_run(prompt, count=False)
                mx.eval([c.state for c in r.cache])
                total = time.perf_counter() - t0
            t1 = time.perf_counter()
            mx.eval(lm.model(mx.array(prompt[r.position:])[None], cache=r.cache))
            runs.append({"restored_tokens": r.position, "restore_ms": total * 1e3,
                         "read_ms": spent["read"] * 1e3, "build_ms": spent["build"] * 1e3,
                         "other_ms": (total - spent["read"] - spent["build"]) * 1e3,
                         "new_tokens": len(prompt) - r.position,
                         "prefill_after_ms": (time.perf_counter() - t1) * 1e3})
        med = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        stats = engine.stats()
        disk = stats.get("disk", {})
        row = {"block_size": block_size, **med,
               "restore_vs_read": round(statistics.median(r["restore_ms"] / r["read_ms"]
                                                          for r in runs), 3),
               "first_prefill_tps": round(done.timings.prompt_tokens / first_s, 1),
               "records": stats["ram"]["records"] + disk.get("records", 0),
               "ram_bytes": stats["ram"]["bytes"], "disk_bytes": disk.get("bytes", 0),
               "turn_ends_recorded": stats["turn_ends_recorded"]}
        notes.append(f"block {block_size}: {row['records']} records, RAM "
                     f"{row['ram_bytes']} bytes, disk {row['disk_bytes']} bytes (sealed).")
        return row
    finally:
        engine.close()
