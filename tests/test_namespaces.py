"""Namespaces per request in one engine (issue 26, item 1): tenants share the batch and the
store, never a checkpoint — keys differ, and a record tagged with another namespace is a miss
even under a colliding key; releasing one tenant's keys leaves the other's records."""

from __future__ import annotations

import pytest

import forkv
from conftest import load_tiny, scoped_engine
from forkv.engine import Engine, SamplingParams
from forkv.engine.cache.recordstore import RecordStore
from helpers import MemoryDisk, fresh_run, random_tokens

ONE = SamplingParams(max_tokens=1)


def _engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return scoped_engine(lm, **kw)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3_5"])
def test_one_engine_keeps_namespaces_apart(arch):
    engine = _engine(load_tiny(arch))
    tokens = random_tokens(600, seed=21)
    try:
        assert engine.generate(tokens, ONE, namespace="a").timings.reused_tokens == 0
        assert engine.generate(tokens, ONE, namespace="a").timings.reused_tokens == 512
        assert engine.generate(tokens, ONE, namespace="b").timings.reused_tokens == 0
        assert engine.generate(tokens, ONE).timings.reused_tokens == 0  # the engine's own
        assert engine.block_keys(tokens, "a") != engine.block_keys(tokens, "b")
        assert engine.block_keys(tokens) == engine.block_keys(tokens, "")
    finally:
        engine.close()


def test_rows_of_different_namespaces_decode_in_one_batch():
    engine = _engine(load_tiny("qwen3"), max_seqs=4)
    prompts = [random_tokens(40, seed=30 + i) for i in range(4)]
    try:
        with engine.paused():
            handles = [engine.submit(p, max_tokens=6, namespace=f"tenant-{i}")
                       for i, p in enumerate(prompts)]
            widest = 0
            while not all(h.done for h in handles):
                widest = max(widest, engine.step_once().decoded)
        assert widest == 4  # every tenant's row in the same decode step
        alone = Engine(load_tiny("qwen3"), checkpoints=False)
        for p, h in zip(prompts, handles):  # and batching changed nothing they got
            assert h.result().token_ids == alone.generate(p, max_tokens=6).token_ids
        alone.close()
    finally:
        engine.close()


def test_a_record_of_another_namespace_is_a_miss_under_a_colliding_key(monkeypatch):
    """Keys are namespace-salted, so a collision needs broken SHA-256; force one and the
    record's namespace tag still refuses it, on the RAM tier and through the disk tier."""
    lm = load_tiny("gemma3")
    for store in (RecordStore(1 << 30, None), RecordStore(0, MemoryDisk())):
        engine = _engine(lm, store=store)
        ck = engine.checkpointer
        a, b = ck.keyer_for("a"), ck.keyer_for("b")
        monkeypatch.setattr(b, "seed", a.seed)  # b's keys now equal a's
        tokens = random_tokens(600, seed=22)
        engine.generate(tokens, ONE, namespace="a")
        engine.drain()
        assert engine.block_keys(tokens, "a") == engine.block_keys(tokens, "b")
        r = engine.generate(tokens, max_tokens=4, namespace="b")
        assert r.timings.reused_tokens == 0 and ck.stats.rejected >= 1
        fresh = fresh_run(lm, tokens, max_tokens=4)
        assert r.token_ids == fresh.token_ids  # a miss, never wrong output
        engine.close()


def test_release_drops_only_that_namespaces_records():
    engine = _engine(load_tiny("qwen3"))
    tokens = random_tokens(600, seed=23)
    try:
        for ns in ("a", "b"):
            engine.generate(tokens, ONE, namespace=ns)
        engine.drain()
        assert engine.release(engine.checkpoint_keys(tokens, "a")) > 0
        assert engine.generate(tokens, ONE, namespace="a").timings.reused_tokens == 0
        assert engine.generate(tokens, ONE, namespace="b").timings.reused_tokens == 512
    finally:
        engine.close()


def test_turn_ends_are_per_namespace():
    engine = _engine(load_tiny("qwen3"))
    chat = [{"role": "user", "content": "hello " * 300}]
    try:
        turn = engine.encode(chat)
        assert engine.turn_keys(turn, "a") != engine.turn_keys(turn, "b")
        # the block keys a caller has already give the same turn keys as the engine's own
        for ns in ("a", "b", None):
            given = engine.turn_keys(turn, ns, block_keys=engine.block_keys(turn, ns))
            assert given == engine.turn_keys(turn, ns) and given
        engine.generate(chat, ONE, namespace="a")
        engine.drain()
        longer = chat + [{"role": "assistant", "content": "ok"},
                         {"role": "user", "content": "more"}]
        assert engine.generate(longer, ONE, namespace="a").timings.reused_tokens == len(turn)
        assert engine.generate(longer, ONE, namespace="b").timings.reused_tokens == 0
    finally:
        engine.close()


def test_sessions_in_namespaces_share_one_engine():
    engine = _engine(load_tiny("qwen3"))
    doc = "cedar " * 400
    try:
        stats = []
        for ns in ("alice", "bob", "alice"):
            with forkv.Session(engine, namespace=ns) as s:
                s.user(doc).final({"max_tokens": 2})
                stats.append(s.run()[0].result.stats)
        assert stats[0].tokens_reused == 0
        assert stats[1].tokens_reused == 0  # bob restores nothing alice computed
        assert stats[2].tokens_reused >= 256  # alice's own, in a new session
    finally:
        engine.close()


def test_a_tenant_ram_budget_evicts_only_that_tenants_records():
    import mlx.core as mx

    from forkv.engine.cache.records import Record
    from forkv.engine.cache.tiers import RamTier
    from forkv.security import StoreSettings

    spilled = []
    tier = RamTier(1 << 20, spill=lambda key, r: spilled.append((key, r.namespace)),
                   namespace_budget=3000)

    def put(ns: bytes, i: int) -> None:
        tier.put(ns + bytes([i]), "global", Record("global", i, b"",
                                                   {"0.k": mx.zeros(250)}, ns))  # 1000 bytes
    for i in range(3):
        put(b"a", i)
        put(b"b", i)
    put(b"a", 3)  # a's fourth record: a's oldest goes, b keeps all three
    assert spilled == [(b"a\x00", b"a")]
    assert tier.stats().bytes == 6000
    assert StoreSettings.from_env(tenant_ram_budget="1MiB").tenant_ram_budget == 1 << 20
