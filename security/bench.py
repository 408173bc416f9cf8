"""Micro-benchmark of the encrypted tier: AES-GCM throughput and store put/get latency.

Knows: how to time sealing/opening with preallocated buffers (the cipher alone) and a real
ephemeral ``BlobStore`` round trip. Does not know: models or restores — the engine's
``forkv bench store`` adds those and calls ``measure_aead``.
Run alone: ``python -m forkv.security.bench``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from .aead import Sealer, make_aad, sealed_size
from .settings import StoreSettings
from .store import BlobStore

__all__ = ["measure_aead"]


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_aead(
    sizes: tuple[int, ...] = (1 << 20, 32 << 20), reps: int = 5, disk_dir: str | None = None
) -> dict[str, Any]:
    """Seal/open GB/s (AES-256-GCM into preallocated buffers) and put/get latency medians.

    Throughput: median over ``reps`` batches of ~64 MB each.
    ``put_ms`` is the caller-side cost of ``put`` (queueing); ``write_ms`` is ``put`` + ``flush``
    (sealed and on disk); ``get_ms`` reads, verifies and decrypts a written record. Uses a
    fresh ephemeral store under ``disk_dir`` (default: the system temp dir), ignoring env.
    """
    sealer = Sealer(os.urandom(32), nonce_limit=1 << 40)
    settings = StoreSettings(disk_budget=4 * max(sizes) + (64 << 20), disk_dir=disk_dir)
    with BlobStore(settings) as store:
        results = [_measure_size(store, sealer, size, reps) for size in sizes]
    return {"cipher": "aes-256-gcm", "reps": reps, "results": results}


def _measure_size(store: BlobStore, sealer: Sealer, size: int, reps: int) -> dict[str, float]:
    data = os.urandom(size)
    aad = make_aad(bytes(16), b"bench", "global", 1, size, b"{}")
    out = memoryview(bytearray(sealed_size(size)))
    plain = memoryview(bytearray(size))
    nonce = sealer.seal_into(data, aad, out)  # first touch of the buffers pays page faults
    sealer.open_into(out, aad, nonce, plain)
    batch = max(1, (64 << 20) // size)  # ~64 MB per timed rep: one 1 MB op is too short to time

    def seal_batch() -> bytes:
        for _ in range(batch):
            nonce = sealer.seal_into(data, aad, out)
        return nonce

    seal_s = _median_s(seal_batch, reps) / batch
    nonce = seal_batch()
    open_s = _median_s(
        lambda: [sealer.open_into(out, aad, nonce, plain) for _ in range(batch)], reps
    )
    open_s /= batch
    key = f"bench-{size}".encode()
    put_s = _median_s(lambda: store.put(key, "global", data), reps)
    store.flush()
    write_s = _median_s(lambda: (store.put(key, "global", data), store.flush()), reps)
    get_s = _median_s(lambda: store.get(key, "global"), reps)
    blob = store.get(key, "global")
    assert blob is not None and blob.data == data, "bench record did not round-trip"
    store.delete(key, "global")
    return {
        "size_bytes": size,
        "seal_gbps": size / seal_s / 1e9,
        "open_gbps": size / open_s / 1e9,
        "put_ms": put_s * 1e3,
        "write_ms": write_s * 1e3,
        "get_ms": get_s * 1e3,
    }


if __name__ == "__main__":
    print(json.dumps(measure_aead(), indent=2))
