"""`forkv bench store`: what encryption costs.

Seal/open throughput and put/get latency of the encrypted blob store (1 MB and 32 MB
records), then the restore of an N-token prefix (8K by default) through four tiers, alternated
rep by rep: live arrays in RAM; the same disk tier without encryption (the same serialised
records in an unencrypted anonymous in-memory file, pread and decoded alike: the strict
baseline); what other engines do (one plain safetensors file per record, read by `mx.load`);
and the AES-256-GCM disk tier. Plaintext never touches a disk: memfd on Linux, bytes elsewhere.
"""

from __future__ import annotations

import os
from functools import partial

from .common import random_tokens, result, summary, timed


def _memfd(name: str) -> int | None:
    """An anonymous in-memory file (Linux), or None where there is none."""
    try:
        return os.memfd_create(name, os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None


class _PlainFileDisk:
    """The disk tier without encryption: records appended to one unencrypted in-memory file,
    read back with pread straight into the caller's buffer (as the encrypted tier does).
    A tier of bytes of the engine's `Tier` protocol."""

    holds_arrays = False

    def __init__(self):
        from forkv.security import DiskIO

        self.io, self.fd = DiskIO(), _memfd("forkv-bench-plain")
        self.slots, self.blobs, self.end = {}, {}, 0  # blobs: the fallback without memfd
        self.bytes_read = 0

    def put(self, key, kind, data, meta=None):
        view = memoryview(data).cast("B")
        if self.fd is None:
            self.blobs[(key, kind)] = bytes(view)
        else:
            self.io.pwrite(self.fd, view, self.end)
            self.slots[(key, kind)] = (self.end, len(view))
            self.end += len(view)
        return True

    def get_into(self, key, kind, alloc):
        from forkv.security import Blob

        if self.fd is None:
            data = self.blobs.get((key, kind))
            if data is None:
                return None
            out = memoryview(alloc(len(data))).cast("B")[: len(data)]
            out[:] = data
            self.bytes_read += len(data)
            return Blob(out, {})
        if (key, kind) not in self.slots:
            return None
        offset, n = self.slots[(key, kind)]
        out = memoryview(alloc(n)).cast("B")[:n]
        self.bytes_read += n
        return Blob(out, {}) if self.io.pread_into(self.fd, out, offset) == n else None

    def contains(self, key, kind):
        return (key, kind) in self.slots or (key, kind) in self.blobs

    def discard(self, key, kind):
        self.slots.pop((key, kind), None)
        self.blobs.pop((key, kind), None)

    def set_eviction_order(self, fn):
        pass  # never full: it holds what the benchmark puts

    def flush(self, timeout=None):
        return True

    def stats(self):
        from types import SimpleNamespace

        return SimpleNamespace(mode="plaintext", num_records=len(self.slots) + len(self.blobs))

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _PlainFilesStore:
    """What other engines do: one plain safetensors file per record, loaded with `mx.load`.
    Only the restore path (get / contains / discard) of a RecordStore."""

    def __init__(self, block_size: int):
        self.block_size, self.files = block_size, {}

    def put(self, key, record):
        from forkv.engine.cache import codec

        data = codec.encode(record, self.block_size)
        fd = _memfd("forkv-bench-record")
        if fd is not None:
            os.pwrite(fd, data, 0)
        self.files[(key, record.kind)] = (fd, data if fd is None else None)

    def get(self, key, kind):
        import io

        import mlx.core as mx
        import numpy as np
        from forkv.engine.cache.records import Record

        fd, data = self.files[(key, kind)]
        src = io.BytesIO(data) if fd is None else f"/proc/self/fd/{fd}"
        arrays, meta = mx.load(src, format="safetensors", return_metadata=True)
        tokens = np.array(arrays.pop("__tokens__"), dtype="<i4").tobytes()
        return Record(kind, int(meta["block"]), tokens, arrays,
                      bytes.fromhex(meta.get("namespace", "")))

    def contains(self, key, kind):
        return (key, kind) in self.files

    def discard(self, key, kind):
        raise AssertionError("the plain-files baseline never rejects a record")

    def close(self):
        for fd, _ in self.files.values():
            if fd is not None:
                os.close(fd)


def run_store_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 5,
                    prefix: int = 8192, processes: int = 3) -> dict:
    """Restore an 8K prefix from each tier. The headline `encryption_overhead` is the median
    over `processes` fresh processes (1 with `quick`): one process's allocator and page-cache
    state moves it by several percent, more than the figure's margin to its target."""
    from forkv.engine import Engine, load_model
    from forkv.engine.cache.recordstore import RecordStore
    from forkv.security import BlobStore, StoreSettings
    from forkv.security.bench import measure_aead

    if processes > 1 and not quick:
        return _median_of_processes(processes, model=model, reps=reps, prefix=prefix)
    if quick:
        reps, prefix = 2, 512
    aead = measure_aead(sizes=(1 << 20, 32 << 20) if not quick else (1 << 20,), reps=reps)
    lm = load_model(model)
    live = RecordStore(1 << 40, None)
    engine = Engine(lm, store=live)
    history = random_tokens(prefix + 1, seed=3)
    engine.generate(history, max_tokens=1)  # records every block of the prefix
    # The tier is filled at once, faster than a run makes records: a queue that holds them all,
    # so none is dropped (the writer's drop-when-full is for generation, not this setup).
    blob = BlobStore(StoreSettings(ram_budget=0, disk_budget=16 << 30, queue_bytes=16 << 30))
    plain = _PlainFileDisk()
    files = _PlainFilesStore(live.block_size)
    tiers = {"ram": live, "plaintext": RecordStore(0, plain), "plain_files": files,
             "encrypted": RecordStore(0, blob)}
    for (key, _kind), record in list(live.ram.items()):
        for name in ("plaintext", "plain_files", "encrypted"):
            tiers[name].put(key, record)
    tiers["encrypted"].flush()
    assert blob.stats().num_dropped == 0, "the encrypted tier dropped records while filling"
    engines = {name: Engine(lm, store=store) for name, store in tiers.items()}
    prompt = history[:prefix] + random_tokens(64, seed=4)
    for e in engines.values():  # warm-up: allocator pools and scratch buffers, not measured
        e.checkpointer.restore(prompt)
    restore_bytes = plain.bytes_read  # serialised bytes one restore reads
    times = {name: [] for name in tiers}
    for _ in range(4 * reps):  # restores take milliseconds: more reps tame a busy machine
        for name, e in engines.items():
            t, restored = timed(partial(e.checkpointer.restore, prompt))
            assert restored.position == prefix, (name, restored.position)
            times[name].append(t)
    record_bytes = live.ram_bytes
    cases = [{"tier": name, "restore_s": summary(v)} for name, v in times.items()]
    med = {name: summary(v)["median"] for name, v in times.items()}
    seal = [r["seal_gbps"] for r in aead["results"]]
    open_gbps = min(r["open_gbps"] for r in aead["results"])
    headline = {"encryption_overhead": round(med["encrypted"] / med["plaintext"], 3),
                "aead_gbps": round(min(seal), 2),
                "encrypted_over_plain_files": round(med["encrypted"] / med["plain_files"], 3),
                "encrypted_over_ram": round(med["encrypted"] / med["ram"], 3)}
    aes_s = restore_bytes / (open_gbps * 1e9)  # what decryption alone costs at measured speed
    physics = "" if headline["encryption_overhead"] <= 1.15 else (
        " AES-GCM runs at about memcpy speed, and the plaintext restore is itself only a few "
        "copies of the records, so decryption cannot hide within 15% of it.")
    in_memfd = plain.fd is not None
    blob.close()
    plain.close()
    files.close()
    return result("store", model, {"prefix_tokens": prefix, "reps": reps,
                                   "restore_reps": 4 * reps,
                                   "record_bytes": record_bytes,
                                   "restore_bytes": restore_bytes, "aead": aead,
                                   "plaintext_in": "memfd" if in_memfd else "bytes in memory"},
                  cases, headline, {"encryption_overhead": "<= 1.15", "aead_gbps": ">= 1"},
                  notes=[
                      ("encryption_overhead = encrypted disk tier / the same tier without "
                       "encryption (same records, same pread and decoding, from an unencrypted "
                       "in-memory file): the strict cost of AES-256-GCM. encrypted_over_"
                       "plain_files compares with one plain safetensors file per record read "
                       "by mx.load (what other engines do); encrypted_over_ram with live "
                       "arrays that need no decoding at all."),
                      (f"Breakdown: decrypting the {restore_bytes / 1e6:.1f} MB one restore "
                       f"reads at the measured {open_gbps:.1f} GB/s (one core) takes "
                       f"~{aes_s * 1e3:.1f} ms; the "
                       f"plaintext tier restores in {med['plaintext'] * 1e3:.1f} ms, the "
                       f"encrypted one in {med['encrypted'] * 1e3:.1f} ms.{physics}"),
                  ], dtype=lm.dtype)


_CHILD = ("import json, sys; from forkv.bench.store import run_store_bench; "
          "print(json.dumps(run_store_bench(processes=1, **json.loads(sys.argv[1]))))")


def _median_of_processes(n: int, **kwargs) -> dict:
    """Run the benchmark in `n` fresh processes, one after another; the result is the run
    whose encryption_overhead is the median, with every run's figure beside it."""
    import json
    import subprocess
    import sys

    runs = []
    for _ in range(n):
        r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kwargs)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"a store benchmark process failed: {r.stderr[-2000:]}")
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    runs.sort(key=lambda run: run["headline"]["encryption_overhead"])
    res = runs[len(runs) // 2]  # n is odd by default; an even n takes the upper middle
    values = [run["headline"]["encryption_overhead"] for run in runs]
    res["headline"]["encryption_overhead_runs"] = values
    res["settings"]["processes"] = n
    target = res["targets"]["encryption_overhead"]
    target["met"] = res["headline"]["encryption_overhead"] <= float(target["target"].split()[1])
    res["notes"].append(f"encryption_overhead is the median of {n} fresh processes: "
                        f"{', '.join(f'{v:.3f}' for v in values)}.")
    return res
