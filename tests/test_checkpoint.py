import numpy as np
import pytest

from conftest import TOLERANCE_KV, load_tiny, scoped_engine
from forkv.engine.cache.layout import CacheKind
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request.generate import prefill
from helpers import MemoryDisk, fresh_logits, fresh_run, random_tokens


def _engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return scoped_engine(lm, **kw)


def _restore_logits(engine, tokens):
    engine.drain()  # decode boundaries are recorded by record jobs after the request
    r = engine.checkpointer.restore(tokens)
    return r.position, prefill(engine.lm.model, r.cache, tokens, r.position, engine.block_size)


# bfloat16 never uses BLAS on the CPU (4-10 s per arch): CI runs it with --slow.
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_restore_is_bit_exact(arch, dtype):
    import mlx.core as mx

    lm = load_tiny(arch, dtype)
    engine = _engine(lm)
    prompt = random_tokens(1000, seed=1)
    out = engine.generate(prompt, max_tokens=30)  # decode crosses the 1024 boundary
    history = prompt + out.token_ids
    assert len(history) > 1024 or out.finish_reason == "stop"
    plain_engine = scoped_engine(lm, checkpoints=False)
    # 256: first block; 768: past the 128-token window; 1024: reached while decoding
    for cut in (256, 768, 1024):
        if cut >= len(history):
            continue
        tokens = history[:cut] + random_tokens(40, seed=cut)  # a different continuation
        position, got = _restore_logits(engine, tokens)
        assert position == cut
        assert mx.array_equal(got, fresh_logits(lm, tokens)).item(), (arch, dtype, cut)
        greedy = engine.generate(tokens, max_tokens=6)
        plain = plain_engine.generate(tokens, max_tokens=6)
        assert greedy.token_ids == plain.token_ids and greedy.timings.reused_tokens == cut
    plain_engine.close()


def test_restore_matches_single_shot_within_tolerance(arch):
    import mlx.core as mx

    lm = load_tiny(arch, kv_dtype=TOLERANCE_KV)  # (conftest: two chunkings compared)
    engine = _engine(lm)
    tokens = random_tokens(700, seed=2)
    engine.generate(tokens[:600], max_tokens=1)
    position, got = _restore_logits(engine, tokens)
    single = lm.model(mx.array(tokens)[None], cache=lm.make_cache())[0, -1]
    assert position == 512
    np.testing.assert_allclose(np.array(got), np.array(single), atol=2e-4, rtol=1e-4)


def test_stats_count_reuse_and_hits():
    engine = _engine(load_tiny("gemma3"))
    tokens = random_tokens(600, seed=4)
    first = engine.generate(tokens, max_tokens=1)
    second = engine.generate(tokens[:520] + [1, 2, 3], max_tokens=1)
    assert first.timings.reused_tokens == 0 and first.timings.computed_tokens == 600
    assert second.timings.reused_tokens == 512 and second.timings.computed_tokens == 11
    s = engine.checkpointer.stats
    assert s.hits["global"] == 2 and s.hits["window"] == 1 and s.blocks_recorded == 2
    assert s.tokens_reused == 512


def test_namespaces_never_share_blocks():
    lm = load_tiny("qwen3")
    store = RecordStore(1 << 30, None)
    a = scoped_engine(lm, store=store, namespace="tenant-a")
    b = scoped_engine(lm, store=store, namespace="tenant-b")
    tokens = random_tokens(600, seed=6)
    a.generate(tokens, max_tokens=1)
    assert b.generate(tokens, max_tokens=1).timings.reused_tokens == 0
    assert a.generate(tokens, max_tokens=1).timings.reused_tokens == 512


def test_other_model_fingerprint_is_never_used():
    store = RecordStore(1 << 30, None)
    tokens = random_tokens(600, seed=7)
    scoped_engine(load_tiny("qwen3"), store=store).generate(tokens, max_tokens=1)
    other = scoped_engine(load_tiny("qwen3", "bfloat16"), store=store)
    assert other.generate(tokens, max_tokens=1).timings.reused_tokens == 0


def test_colliding_keys_with_other_tokens_are_rejected(monkeypatch):
    lm = load_tiny("qwen3_5")
    engine = _engine(lm)
    # A keyer that ignores tokens: every sequence hashes alike.
    monkeypatch.setattr(engine.checkpointer.keyer, "keys",
                        lambda tokens, extras=None, start=0, prev=None:
                        [bytes([i]) * 32 for i in range(start, len(tokens) // 256)])
    engine.generate(random_tokens(600, seed=8), max_tokens=1)
    other = random_tokens(600, seed=9)
    r = engine.generate(other, max_tokens=4)
    assert r.timings.reused_tokens == 0 and engine.checkpointer.stats.rejected >= 1
    assert r.token_ids == fresh_run(lm, other, max_tokens=4).token_ids


@pytest.mark.parametrize("kind", ["state", "window", "global"])
def test_corrupt_or_missing_record_recomputes_identically(kind):
    lm = load_tiny({"state": "qwen3_5", "window": "gemma3", "global": "qwen3"}[kind])
    disk = MemoryDisk()
    # RAM budget 0: every record lives on the (stand-in) disk tier; no live caches, so the
    # repeat restores from the records (rather than take the prompt's cache over).
    engine = _engine(lm, store=RecordStore(0, disk), live_cache_mib=0)
    tokens = random_tokens(800, seed=10)
    engine.generate(tokens, max_tokens=1)
    expected = fresh_run(lm, tokens, max_tokens=8)
    slots = [s for s in disk.blobs if s[1] == kind]  # in the order written
    disk.blobs[slots[-1]] = disk.blobs[slots[-1]][:-7] + b"\xff" * 7  # corrupt the newest
    r = engine.generate(tokens, max_tokens=8)
    assert r.token_ids == expected.token_ids and r.timings.reused_tokens < 768
    for s in slots:
        disk.blobs.pop(s, None)  # now missing altogether
    r = engine.generate(tokens, max_tokens=8)
    assert r.token_ids == expected.token_ids


def test_eviction_leaves_a_restorable_prefix():
    lm = load_tiny("gemma3")
    store = RecordStore(ram_budget=300_000, disk=None)
    engine = _engine(lm, store=store)
    tokens = random_tokens(1300, seed=11)
    engine.generate(tokens, max_tokens=1)
    assert store.stats.ram_evictions > 0 and store.ram_bytes <= 300_000
    r = engine.generate(tokens, max_tokens=4)
    assert 0 < r.timings.reused_tokens < 1280
    assert r.token_ids == fresh_run(lm, tokens, max_tokens=4).token_ids


def test_model_without_known_caches_runs_without_checkpoints(monkeypatch):
    import warnings

    from forkv.engine.cache.layout import CacheLayout, LayerCache

    lm = load_tiny("qwen3")
    layout = CacheLayout((LayerCache((0,), CacheKind.UNKNOWN, "Mystery"),))
    odd = type(lm)(**{**{k: getattr(lm, k) for k in lm.__slots__}, "layout": layout})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = _engine(odd)
    tokens = random_tokens(600, seed=12)
    engine.generate(tokens, max_tokens=2)
    assert engine.generate(tokens, max_tokens=2).timings.reused_tokens == 0


@pytest.mark.parametrize("arch, block", [("gemma3", 256), ("gemma3", 48), ("qwen3_5", 256)])
def test_decode_boundaries_are_recorded_by_one_job_after_the_request(arch, block):
    import mlx.core as mx

    # Every record leaves RAM at once. Boundaries crossed while decoding are not recomputed in
    # the step: one record job after the request restores the prompt's last boundary (its only
    # reads) and prefills the decoded blocks as chunks (block 48: the 128-token window reaches
    # back over three blocks). Its restore is not counted as a request's reuse.
    lm = load_tiny(arch)
    store = RecordStore(0, MemoryDisk(), block_size=block)
    engine = scoped_engine(lm, block_size=block, store=store)
    tokens = random_tokens(300, seed=10)
    # (no EOS: which tokens a random model emits depends on the CPU's BLAS)
    out = engine.generate(tokens, max_tokens=300,
                          logit_bias={t: -100.0 for t in lm.eos_token_ids})
    assert len(out.token_ids) == 300
    engine.drain()
    st = engine.checkpointer.stats
    cached = 300 + 300 - 1  # the last token is sampled, never fed
    assert st.blocks_recorded == cached // block and st.requests == 1
    assert engine.scheduler.totals.recomputed_tokens == (cached // block - 300 // block) * block
    assert store.stats.disk_misses == 0
    history = tokens + out.token_ids
    for cut in range((300 // block + 1) * block, len(history), block):
        position, got = _restore_logits(engine, history[:cut] + [5])
        assert position == cut
        assert mx.array_equal(got, fresh_logits(lm, history[:cut] + [5], block)).item(), cut


def test_release_drops_every_kind_under_the_keys():
    lm = load_tiny("gemma3")
    store = RecordStore(1 << 30, None)
    engine = _engine(lm, store=store)
    tokens = random_tokens(600, seed=13)
    engine.generate(tokens, max_tokens=1)
    ck = engine.checkpointer
    keys, per_block = ck.keyer.keys(tokens), len(ck.kinds)  # global + window (+ extra)
    assert ck.release(keys[1:]) == per_block
    assert ck.release(keys[1:]) == 0
    assert engine.generate(tokens, max_tokens=1).timings.reused_tokens == 256
    assert ck.release(keys) == 2 * per_block  # block 0, and block 1 recorded again
    assert store.ram_bytes == 0
