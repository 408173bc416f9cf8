"""`forkv bench store`: what encryption costs.

Seal/open throughput and put/get latency of the encrypted blob store (1 MB and 32 MB
records), then the restore of an N-token prefix (8K by default) through three tiers, alternated
rep by rep: live arrays in RAM; the same records serialised but unencrypted in memory (the
plaintext baseline: same bytes, same decoding); and the AES-256-GCM disk tier.
"""

from __future__ import annotations

from .common import random_tokens, result, summary, timed


class _PlainMemoryDisk:
    """The blob-store interface over a dict of plaintext bytes (the unencrypted baseline)."""

    def __init__(self):
        self.blobs = {}

    def put(self, key, kind, data, meta=None):
        self.blobs[(key, kind)] = bytes(data)
        return True

    def get(self, key, kind):
        from forkv.security import Blob

        data = self.blobs.get((key, kind))
        return None if data is None else Blob(data, {})

    def contains(self, key, kind):
        return (key, kind) in self.blobs

    def delete(self, key, kind):
        self.blobs.pop((key, kind), None)

    def set_eviction_order(self, fn):
        pass

    def flush(self):
        pass

    def close(self):
        pass


def run_store_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 5,
                    prefix: int = 8192) -> dict:
    from forkv.engine import Engine, load_model
    from forkv.engine.recordstore import RecordStore
    from forkv.security import BlobStore, StoreSettings
    from forkv.security.bench import measure_aead

    if quick:
        reps, prefix = 2, 512
    aead = measure_aead(sizes=(1 << 20, 32 << 20) if not quick else (1 << 20,), reps=reps)
    lm = load_model(model)
    live = RecordStore(1 << 40, None)
    engine = Engine(lm, store=live)
    history = random_tokens(prefix + 1, seed=3)
    engine.generate(history, max_tokens=1)  # records every block of the prefix
    blob = BlobStore(StoreSettings(ram_budget=0, disk_budget=16 << 30))
    tiers = {"ram": live, "plaintext": RecordStore(0, _PlainMemoryDisk()),
             "encrypted": RecordStore(0, blob)}
    for (key, _kind), record in list(live._ram.items()):
        tiers["plaintext"].put(key, record)
        tiers["encrypted"].put(key, record)
    tiers["encrypted"].flush()
    engines = {name: Engine(lm, store=store) for name, store in tiers.items()}
    prompt = history[:prefix] + random_tokens(64, seed=4)
    times = {name: [] for name in tiers}
    for _ in range(reps):
        for name, e in engines.items():
            t, restored = timed(lambda: e.checkpointer.restore(prompt))
            assert restored.position == prefix, (name, restored.position)
            times[name].append(t)
    record_bytes = sum(r.nbytes for r in live._ram.values())
    cases = [{"tier": name, "restore_s": summary(v)} for name, v in times.items()]
    med = {name: summary(v)["median"] for name, v in times.items()}
    seal = [r["seal_gbps"] for r in aead["results"]]
    headline = {"encryption_overhead": round(med["encrypted"] / med["plaintext"], 3),
                "aead_gbps": round(min(seal), 2),
                "encrypted_over_ram": round(med["encrypted"] / med["ram"], 3)}
    blob.close()
    return result("store", model, {"prefix_tokens": prefix, "reps": reps,
                                   "record_bytes": record_bytes, "aead": aead},
                  cases, headline, {"encryption_overhead": "<= 1.15", "aead_gbps": ">= 1"},
                  notes=["encryption_overhead = encrypted disk tier / the same serialised "
                         "records unencrypted in memory; encrypted_over_ram compares with live "
                         "arrays that need no decoding at all."], dtype=lm.dtype)
