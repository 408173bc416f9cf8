"""`Engine.stats()`: one plain dict of what the engine did and holds.

Reuse and hits / misses per record kind (the checkpointer), bytes and records per tier with
evictions (the record store and its disk tier), the request queue (the scheduler), and the RAM
budget's split (cache/budget.py). Reads counters only: safe from any thread, and it never
touches mlx.
"""

from __future__ import annotations


def engine_stats(engine) -> dict:
    sched = engine.scheduler
    queue = {"waiting": len(sched.waiting), "prefilling": len(sched.prefilling),
             "running": len(sched.rows), "record_jobs": len(engine.prefix.jobs)}
    out: dict = {"queue": queue, "steps": sched.totals.as_dict(),
                 "ram_budget": engine.budget.as_dict()}
    ck = engine.checkpointer
    if ck is None:
        return {"checkpoints": False, **out}
    out = {"checkpoints": ck.enabled, **ck.stats.as_dict(), **out}
    live = engine.prefix.live
    if live is not None:
        out["live"] = {**live.stats.as_dict(), "entries": len(live.entries), "bytes": live.nbytes,
                       "budget_bytes": live.budget_bytes}
    store = engine.store
    tiers = store.stats
    out["ram"] = {"bytes": tiers.ram_bytes, "records": tiers.ram_records,
                  "evictions": tiers.ram_evictions, "spilled": tiers.spilled,
                  "bytes_by_kind": dict(tiers.by_kind)}
    if store.disk is not None:
        d = store.disk.stats()
        out["disk"] = {"bytes": d.bytes_on_disk, "records": d.num_records,
                       "evictions": d.num_evictions, "bytes_written": d.bytes_written,
                       "dropped": d.num_dropped, "tampered": d.num_tampered,
                       "degraded": d.is_degraded, "hits": d.num_hits, "misses": d.num_misses}
    return out
