"""Fast reuse (engine/cache/live.py, issue 25 item 1): a request continues a recently finished
request's cache at any token it shares — global layers sliced, sliding-window rings cut back
as far as they hold the window, recurrent state only where it stands — in its own namespace
only; what it computes reaches the records through a record job, canonically; exact requests
on the same engine stay bit for bit a fresh run."""

from __future__ import annotations

import pytest

from conftest import load_tiny
from forkv.engine import Engine, EngineConfigError, GenerationError, SamplingParams
from forkv.engine.cache.live import cut, cut_limit
from forkv.engine.cache.recordstore import RecordStore
from helpers import fresh_run, random_tokens

GREEDY = SamplingParams(max_tokens=6, temperature=0)


def _engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return Engine(lm, **kw)


def _after_answer(engine, a, new: int, seed: int, **kw) -> list[int]:
    """The next prompt after `a`'s greedy answer: `a`, every token the answer fed, and `new`
    more tokens (the last sampled token is never fed)."""
    first = engine.generate(a, GREEDY, **kw)
    return a + first.token_ids[:-1] + random_tokens(new, seed=seed)


def _assert_exact(engine, tokens, reused: int) -> None:
    """An exact request restores `reused` tokens and gets a fresh run's output bit for bit."""
    got = engine.generate(tokens, GREEDY, reuse="exact")
    assert got.timings.reused_tokens == reused
    fresh = fresh_run(engine.lm, tokens, GREEDY)
    assert got.token_ids == fresh.token_ids and got.logprobs == fresh.logprobs


def _assert_fast(engine, tokens, reused: int) -> None:
    """A fast request reuses `reused` tokens and gets a fresh run's greedy tokens, with
    logprobs within rounding."""
    got = engine.generate(tokens, GREEDY)
    assert got.timings.reused_tokens == reused
    fresh = fresh_run(engine.lm, tokens, GREEDY)
    assert got.token_ids == fresh.token_ids
    assert all(abs(x - y) < 1e-3 for x, y in zip(got.logprobs, fresh.logprobs))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3_5"])
def test_the_next_turn_continues_the_finished_cache(arch):
    lm = load_tiny(arch)
    fast = _engine(lm, reuse="fast")
    a = random_tokens(600, seed=1)
    try:
        first = fast.generate(a, GREEDY)
        fed = a + first.token_ids[:-1]  # the last sampled token is never fed
        b = fed + random_tokens(40, seed=2)
        # every token the first request fed (exact reuse restores block 512 only)
        _assert_fast(fast, b, len(fed))
        live = fast.stats()["live"]
        assert live["hits"] == 1 and live["tokens"] == len(fed)
        assert live["beyond_records"] == len(fed) - 512
        assert fast.generate(b, GREEDY, reuse="exact").timings.reused_tokens == 512
    finally:
        fast.close()


@pytest.mark.parametrize("arch,reused", [("qwen3", 550), ("gemma3", 550), ("qwen3_5", 512)])
def test_a_fork_cuts_the_prompt_cache_back(arch, reused):
    """Another question on the same document: global layers cut anywhere; gemma3's rings
    right after prefill hold their last chunk (88 tokens here), enough to go back 50;
    recurrent state cannot go back, so qwen3_5 restores its records."""
    lm = load_tiny(arch)
    fast = _engine(lm, reuse="fast")
    doc = random_tokens(550, seed=3)
    try:
        fast.generate(doc + random_tokens(50, seed=4), GREEDY)
        b = doc + random_tokens(30, seed=5)
        _assert_fast(fast, b, reused)
    finally:
        fast.close()


def test_a_next_turn_that_rewrites_the_answer_end_continues_the_answer_cache():
    """Decoding trims gemma3's rings to W; the answer's cache keeps the prompt's rings joined
    to the decoded tokens, so a client that sends back the answer without its last words
    continues it up to where the two differ (not only to the prompt's end)."""
    lm = load_tiny("gemma3")  # window 128
    fast = _engine(lm, reuse="fast")
    a = random_tokens(300, seed=30)
    try:
        first = fast.generate(a, SamplingParams(max_tokens=20, temperature=0))
        b = a + first.token_ids[:17] + random_tokens(20, seed=31)  # 2 fed tokens rewritten
        _assert_fast(fast, b, 317)
    finally:
        fast.close()


def test_a_window_ring_is_cut_only_while_it_holds_the_window():
    lm = load_tiny("gemma3")  # window 128
    cache = lm.make_cache()
    import mlx.core as mx

    tokens = random_tokens(400, seed=6)
    lm.model(mx.array(tokens)[None], cache=cache)  # one chunk: rings hold 127 + 400
    assert cut_limit(cache, 400, 399) == 399
    assert cut_limit(cache, 400, 10) == 10  # the ring still holds every token
    for t in random_tokens(200, seed=7):  # decoding trims the rings to 128
        lm.model(mx.array([[t]]), cache=cache)
    assert cut_limit(cache, 600, 599) == 599  # one token back: still 127 held before it
    assert cut_limit(cache, 600, 598) == 0
    short = cut(cache, 600, 599, lm.make_cache)
    assert all(c.offset == 599 for c in short) and all(c.offset == 600 for c in cache)


def test_fast_reuse_stays_inside_its_namespace():
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast")
    a = random_tokens(300, seed=8)
    try:
        b = _after_answer(fast, a, 20, 9, namespace="a")
        assert fast.generate(b, GREEDY, namespace="b").timings.reused_tokens == 0
        assert fast.generate(b, GREEDY, namespace="a").timings.reused_tokens == len(b) - 20
    finally:
        fast.close()


def test_release_drops_the_live_caches_that_hold_the_tokens():
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast")
    a = random_tokens(300, seed=10)
    try:
        b = _after_answer(fast, a, 20, 11)
        dropped = fast.release(fast.checkpoint_keys(a)[:1])
        assert dropped >= 3  # the block record and both live caches (prompt, answer)
        assert fast.stats()["live"]["entries"] == 0
        assert fast.generate(b, GREEDY).timings.reused_tokens == 0
    finally:
        fast.close()


def test_what_a_fast_request_computed_is_recorded_canonically_when_it_leaves():
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast")
    fast.prefix.live.max_entries = 2  # so the next request's caches push these out
    a = random_tokens(600, seed=12)
    try:
        b = _after_answer(fast, a, 150, 13)
        got = fast.generate(b, SamplingParams(max_tokens=20, temperature=0))  # decodes past 768
        assert got.timings.reused_tokens == 605
        assert fast.stats()["live"]["evicted"] == 2
        fast.generate(random_tokens(50, seed=14), GREEDY)  # pushes out b's caches: its jobs
        fast.drain(timeout=60)
        c = b + got.token_ids[:-1] + random_tokens(10, seed=15)
        _assert_exact(fast, c, 768)  # the block b's job recorded
    finally:
        fast.close()


def test_a_fast_request_that_would_cross_block_boundaries_runs_from_the_records():
    """From a live cache nothing can be recorded until its record job runs: a prompt with
    blocks left to compute runs from the records instead, and records them for the next
    request."""
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast")
    a = random_tokens(300, seed=19)
    try:
        b = _after_answer(fast, a, 700, 20)  # past boundaries 512 and 768
        assert fast.generate(b, GREEDY).timings.reused_tokens == 256  # not the live 305
        assert fast.stats()["live"]["hits"] == 0
        _assert_exact(fast, b + random_tokens(10, seed=21), 768)
    finally:
        fast.close()


def test_a_fast_request_crosses_one_block_boundary_and_its_job_records_it():
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast")
    fast.prefix.live.max_entries = 2
    a = random_tokens(400, seed=22)
    try:
        b = _after_answer(fast, a, 200, 23)  # 405 live tokens, then past boundary 512
        _assert_fast(fast, b, 405)
        fast.generate(random_tokens(50, seed=24), GREEDY)  # pushes out b's caches: its job
        fast.drain(timeout=60)
        _assert_exact(fast, b + random_tokens(10, seed=25), 512)
    finally:
        fast.close()


def test_a_fork_just_before_a_block_boundary_continues_the_prompt_cache():
    """The prompt's last chunk (19 tokens after boundary 512) trims gemma3's rings to
    W - 1 = 127 tokens before it: too few to go back one token more. The pool keeps the
    rings from before that chunk as well, so a question diverging at 511 continues the
    cache (records alone would give 256)."""
    lm = load_tiny("gemma3")  # window 128
    fast = _engine(lm, reuse="fast")
    doc = random_tokens(511, seed=26)
    try:
        fast.generate(doc + random_tokens(20, seed=27), GREEDY)
        b = doc + random_tokens(20, seed=28)
        _assert_fast(fast, b, 511)
        c = doc + random_tokens(20, seed=29)  # from b's prompt cache, itself a fast run
        _assert_fast(fast, c, 511)
    finally:
        fast.close()


def test_exact_requests_on_a_fast_engine_are_bit_for_bit():
    lm = load_tiny("gemma3")
    fast = _engine(lm, reuse="fast")
    a = random_tokens(600, seed=16)
    try:
        _assert_exact(fast, _after_answer(fast, a, 40, 17), 512)
    finally:
        fast.close()


def test_branches_of_one_prompt_wait_for_the_first_and_continue_its_cache():
    lm = load_tiny("qwen3")
    fast = _engine(lm, reuse="fast", max_seqs=4)
    prompt = random_tokens(200, seed=18)  # under one block: no record to wait for
    try:
        handles = [fast.submit(prompt, max_tokens=3, temperature=0.8, seed=i)
                   for i in range(3)]
        reused = sorted(h.result().timings.reused_tokens for h in handles)
        assert reused == [0, 199, 199]
    finally:
        fast.close()


def test_bad_reuse_values_are_clear_errors(monkeypatch):
    lm = load_tiny("qwen3")
    with pytest.raises(EngineConfigError, match="reuse"):
        Engine(lm, reuse="quick")
    monkeypatch.setenv("FORKV_REUSE", "sometimes")
    with pytest.raises(EngineConfigError, match="FORKV_REUSE|reuse"):
        Engine(lm)
    monkeypatch.delenv("FORKV_REUSE")
    engine = _engine(lm)
    try:
        with pytest.raises(GenerationError, match="reuse='later'"):
            engine.submit([1, 2, 3], max_tokens=1, reuse="later")
    finally:
        engine.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_prompt_and_its_answer_keep_one_copy_of_their_global_kv(arch):
    """The prompt's entry and the answer's (which holds the prompt as its prefix) share the
    global layers' K/V buffer once equal bit for bit; a prefix that differs keeps its own; a
    turn continued from the shared entry still gets a fresh run's tokens."""
    import mlx.core as mx

    from forkv.engine.cache.live import _share_kv

    lm = load_tiny(arch)
    fast = _engine(lm, reuse="fast")
    a = random_tokens(600, seed=5)
    try:
        first = fast.generate(a, GREEDY)
        pool = fast.prefix.live
        entries = sorted(pool.entries.values(), key=lambda e: len(e.tokens))
        prompt, answer = entries[0], entries[-1]
        assert len(prompt.tokens) == len(a) and answer.tokens[:len(a)] == a
        globals_ = [(x, y) for x, y in zip(prompt.cache, answer.cache)
                    if type(x).__name__ == "KVCache"]
        assert globals_
        for x, y in globals_:
            assert mx.array_equal(x.keys, y.keys[..., :len(a), :]).item()
        # copies of the prompt's K/V, then shared: their buffers go
        before = mx.get_active_memory()
        copies = [(type(x)(), y) for x, y in globals_]
        for (c, y), (x, _) in zip(copies, globals_):
            c.keys, c.values, c.offset = mx.array(x.keys), mx.array(x.values), x.offset
        mx.eval([c.keys for c, _ in copies] + [c.values for c, _ in copies])
        grown = mx.get_active_memory() - before
        for c, y in copies:
            _share_kv(c, y, c.offset)
        del x
        import gc

        gc.collect()
        assert mx.get_active_memory() - before < grown / 4  # the copies' buffers are gone
        c, y = copies[0]
        odd = type(c)()
        odd.keys, odd.values, odd.offset = c.keys + 1, c.values, c.offset
        _share_kv(odd, y, odd.offset)
        assert not mx.array_equal(odd.keys, y.keys[..., :odd.offset, :]).item()  # kept
        b = a + first.token_ids[:-1] + random_tokens(30, seed=6)
        _assert_fast(fast, b, len(a) + len(first.token_ids) - 1)
    finally:
        fast.close()


def test_the_last_canonical_cut_equals_the_sorted_cuts_it_replaces():
    """_hand_off finds the last canonical cut a live cache reaches by bisection (a deep chat has
    a turn end a turn); it is the last of every block boundary and turn end before the
    prompt's end, at or before what the two share."""
    import random

    from forkv.engine.cache.prefix_cache import _last_cut

    rng = random.Random(5)
    for _ in range(500):
        n, B = rng.randrange(1, 2000), rng.choice([16, 256])
        ends = sorted(rng.sample(range(1, n + 1), min(n, rng.randrange(0, 40))))
        cuts = sorted({*range(B, n, B), *(e for e in ends if e < n)})
        for shared in (0, rng.randrange(0, n + 1), n):
            want = max([c for c in cuts if c <= shared], default=0)
            assert _last_cut(ends, n, B, shared) == want, (n, B, ends, shared)


def test_a_fast_chats_turn_compares_only_its_own_new_kv(monkeypatch):
    """A fast chat's entries share one K/V buffer; a new entry compares none of what it is known
    to hold equal (the cache it continued, its own prompt's, and every entry reading one found
    equal), so the tokens compared a turn do not grow with the chat. Every skipped compare
    is checked here to hold bit for bit, and sharing stays what a full compare decides."""
    import mlx.core as mx

    from forkv.engine.cache import live

    compared, real = [], live._share_kv

    def checked(short, long_, p, check_from=0):
        if live._kinds.kind_of(short) is live._GLOBAL and short.keys is not None:
            n = min(check_from, p)  # what is taken as known equal: it must be
            assert mx.array_equal(short.keys[..., :n, :], long_.keys[..., :n, :]).item()
            assert mx.array_equal(short.values[..., :n, :], long_.values[..., :n, :]).item()
            full = real(short, long_, p, 0) if n else None  # (the answer a full compare gives)
            got = real(short, long_, p, check_from)
            assert full is None or full == got
            compared.append(p - n)
            return got
        return real(short, long_, p, check_from)

    monkeypatch.setattr(live, "_share_kv", checked)
    engine = _engine(load_tiny("qwen3"), reuse="fast")
    try:
        tokens, per_turn = random_tokens(300, seed=7), []
        for turn in range(14):
            compared.clear()
            got = engine.generate(tokens, GREEDY)
            per_turn.append(sum(compared))
            tokens = tokens + got.token_ids[:-1] + random_tokens(60, seed=100 + turn)
        assert engine.prefix.live.stats.puts >= 28
        # (known equal, all of it: 0 tokens a turn here; comparing every entry whole was
        # 6,300 tokens at turn 2 and 148,620 at turn 14)
        assert max(per_turn[4:]) <= 3 * max(per_turn[1:4]), per_turn
    finally:
        engine.close()


def test_a_fast_chats_record_jobs_rerun_only_its_own_tokens_at_any_depth():
    """A fast turn computes its own new tokens, and the record job its entry leaves computes
    only what the records lack: from the last recorded block on, never the chat above it. The
    tokens a turn computes (its request and the jobs run before the next turn) stay bounded by
    a block and the turn whatever the depth (counted, not timed: profiled, a fast turn's CPU at
    depth is the model's own attention, equal to mlx-lm's forward of the same tokens)."""
    engine = _engine(load_tiny("qwen3"), reuse="fast")
    engine.prefix.live.max_entries = 4  # (entries leave, and queue their jobs, every turn)
    jobs, done = engine.prefix.jobs, []
    real = jobs.run

    def counted(waiting, idle):
        n = real(waiting, idle)
        done.append(n)
        return n

    jobs.run = counted
    try:
        tokens, per_turn = random_tokens(300, seed=11), []
        for turn in range(24):
            done.clear()
            got = engine.generate(tokens, GREEDY)
            engine.drain(timeout=60)
            per_turn.append((got.timings.computed_tokens, sum(done)))
            tokens = tokens + got.token_ids[:-1] + random_tokens(64, seed=200 + turn)
        assert len(tokens) > 1800 and sum(j for _, j in per_turn) > 0
        # (at most a block the records lack, the turn and its answer)
        limit = engine.block_size + 64 + GREEDY.max_tokens
        assert all(c <= 64 + 1 and c + j <= limit + 64 for c, j in per_turn[1:]), per_turn
        assert max(j for _, j in per_turn[-6:]) <= limit, per_turn
    finally:
        engine.close()


def test_a_fast_chats_turn_compares_only_its_own_new_tokens(monkeypatch):
    """The live pool's token compares a turn (putting the prompt's and the answer's entries,
    finding the cache to continue) are one pass over the chat's tokens, not one an entry: an
    entry that reads an entry known to begin the new one's tokens, and the cache the request
    continued, up to where it took it, are not compared again, nor is an entry that could not
    beat the best found so far. Counted in tokens handed to shared_prefix, not timed."""
    from forkv.engine.cache import live

    compared, real = [], live.shared_prefix

    def counted(a, b):
        compared.append(0 if a is b else min(len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(live, "shared_prefix", counted)
    engine = _engine(load_tiny("qwen3"), reuse="fast")
    try:
        tokens, per_turn = random_tokens(300, seed=9), []
        for turn in range(16):
            compared.clear()
            got = engine.generate(tokens, GREEDY)
            per_turn.append(sum(compared))
            tokens = tokens + got.token_ids[:-1] + random_tokens(60, seed=300 + turn)
        assert engine.prefix.live.stats.hits >= 15 and len(tokens) > 1200
        # (1,215 tokens at turn 16 here; comparing every entry whole was 69,450, and 26,260
        # at turn 9)
        assert max(per_turn[8:]) <= 2 * len(tokens), per_turn
    finally:
        engine.close()


def test_same_bits_compares_bytes_of_strided_views():
    """The pool's K/V compare (numpy over unsigned views of slices along the token axis)
    finds one flipped bit anywhere, tells -0.0 from 0.0 (a bit-for-bit contract, not float
    equality), and agrees with mx.array_equal elsewhere, in every cache dtype."""
    import mlx.core as mx
    import numpy as np

    from forkv.engine.cache.live import same_bits

    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        a = mx.random.normal((1, 3, 300, 64), key=mx.random.key(1)).astype(dtype)
        b = mx.array(a) + 0
        assert same_bits([(a[..., 7:250, :], b[..., 7:250, :]), (a, b)])
        assert not same_bits([(a[..., :250, :], b[..., 1:251, :])])
        assert not same_bits([(a[..., :250, :], b[..., :251, :])])  # shapes differ
        flipped = np.array(mx.view(b, mx.uint8))
        flipped.reshape(-1)[flipped.size - 3] ^= 1  # one bit near the end
        c = mx.view(mx.array(flipped), dtype)
        assert not same_bits([(a, c)]) and same_bits([(a[..., :299, :], c[..., :299, :])])
        assert not same_bits([(a, a.astype(mx.float32 if dtype != mx.float32 else mx.float16))])
    zero = mx.zeros((4,))
    assert mx.array_equal(zero, -zero).item() and not same_bits([(zero, -zero)])


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_request_sent_again_replaces_its_twin_entries(arch, monkeypatch):
    """The same prompt sent again puts entries holding the very tokens the pool already has:
    the older twins leave (no pile of copies, each compared on every later put), the pool
    keeps one entry a token list, and the answers stay a fresh run's. A twin that can be cut
    back further (a sliding-window ring right after prefill) is not replaced by one that
    cannot."""
    from forkv.engine.cache import live

    lm = load_tiny(arch)
    fast = _engine(lm, reuse="fast")
    a = random_tokens(600, seed=21)
    try:
        first = fast.generate(a, GREEDY)
        for _ in range(3):
            again = fast.generate(a, GREEDY)
            assert again.token_ids == first.token_ids
        pool = fast.prefix.live
        twins: dict[tuple, list[int]] = {}  # token list -> its entries' reach, oldest first
        for e in pool.entries.values():
            twins.setdefault(tuple(e.tokens), []).append(live._reach(e.cache, len(e.tokens)))
        for reaches in twins.values():  # an older twin stays only if it reaches further back
            assert reaches == sorted(set(reaches)) and len(reaches) <= 2
        if arch == "qwen3":  # (global K/V only: every twin reaches back to 0)
            assert all(len(r) == 1 for r in twins.values())
        assert fast.stats()["live"]["replaced"] >= 3
        # one that reaches back less far does not push out one that reaches further
        entry = next(e for e in pool.entries.values() if len(e.tokens) == len(a))
        monkeypatch.setattr(live, "_reach", lambda cache, n: n if cache is not entry.cache
                            else 0)
        pool.put(list(entry.tokens), live.cut(entry.cache, len(a), len(a), lm.make_cache),
                 entry.tag)
        assert id(entry) in pool.entries
    finally:
        fast.close()


def test_a_prompt_sent_again_compares_one_entrys_kv_at_most(monkeypatch):
    """A prompt sent again (restored from records, so continuing no entry) is compared with
    the longest entry it begins; every other entry that reads the same buffer (the same
    `_root`) is then known equal without a compare, and the sharing still holds bit for bit
    (each skipped range is checked here)."""
    import mlx.core as mx

    from forkv.engine.cache import live

    compared, real = [], live._share_kv

    def checked(short, long_, p, check_from=0):
        if live._kinds.kind_of(short) is live._GLOBAL and short.keys is not None:
            n = min(check_from, p)
            assert mx.array_equal(short.keys[..., :n, :], long_.keys[..., :n, :]).item()
            compared.append(p - n)
        return real(short, long_, p, check_from)

    monkeypatch.setattr(live, "_share_kv", checked)
    fast = _engine(load_tiny("qwen3"), reuse="fast")
    try:
        b = _after_answer(fast, random_tokens(500, seed=31), 300, 32)
        layers = sum(live._kinds.kind_of(c) is live._GLOBAL for c in fast.lm.make_cache())
        per_send = []
        for _ in range(8):
            compared.clear()
            fast.generate(b, GREEDY)
            per_send.append(sum(compared) // layers)
        assert all(n <= len(b) for n in per_send[2:]), per_send
        # chains stay short (the twins that left are not kept alive one behind another), and
        # what an entry remembers is about entries still in the pool
        entries = fast.prefix.live.entries
        assert max(len(live._chain(e)) for e in entries.values()) <= 3
        assert all(k in entries for e in entries.values() for k in e.differs)
    finally:
        fast.close()


def _siblings(lm, monkeypatch, split: bool) -> tuple[list, int, dict]:
    """Two questions on one document, then the second's next turn and a cut inside the
    document: every output, the mlx bytes the pool held after the second, its stats."""
    import gc

    import mlx.core as mx

    from forkv.engine.cache import live

    if not split:
        monkeypatch.setattr(live.LivePool, "_split_from", lambda *a, **k: None)
    fast = _engine(lm, reuse="fast")
    doc = random_tokens(700, seed=40)
    try:
        gc.collect()
        before = mx.get_active_memory()
        outs = [fast.generate(doc + random_tokens(40, seed=41), GREEDY)]
        two = doc + random_tokens(30, seed=42)
        outs.append(fast.generate(two, GREEDY))
        gc.collect()
        held = mx.get_active_memory() - before
        outs.append(fast.generate(two + outs[1].token_ids[:-1] + random_tokens(20, seed=43),
                                  GREEDY))
        outs.append(fast.generate(doc[:650] + random_tokens(25, seed=44), GREEDY))
        pool = fast.prefix.live
        for e in pool.entries.values():
            for c in e.cache:
                if isinstance(c, live.SplitKV):  # its parts: the document's, and its own
                    assert c.p == e.split_of[1] and c.p in (650, len(doc))
                    assert c.tail_keys.shape[2] == len(e.tokens) - c.p
        return [(o.token_ids, o.logprobs, o.timings.reused_tokens) for o in outs], held, \
            pool.stats.as_dict()
    finally:
        monkeypatch.undo()
        fast.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_siblings_of_one_prompt_keep_one_copy_of_its_global_kv(arch, monkeypatch):
    """Two questions on one document are siblings: neither holds the other. The second's
    entries hold the document's global K/V as views of the first's and their own tokens as
    a copy (SplitKV), so its own full buffers go once it finishes. Requests continuing the
    sibling past the shared prefix, or cut inside it, get the very bits they get with every
    entry whole."""
    lm = load_tiny(arch)
    whole, held_whole, stats_whole = _siblings(lm, monkeypatch, split=False)
    split, held_split, stats = _siblings(lm, monkeypatch, split=True)
    assert stats_whole["split"] == 0 and stats["split"] >= 2  # the fork's prompt and answer
    assert split == whole  # tokens, logprobs and reused tokens, bit for bit
    assert [r for _, _, r in split][2:] == [730 + len(whole[1][0]) - 1, 650]
    assert held_split < held_whole  # the second sibling's copy of the document is gone


def test_a_split_entry_cut_gives_the_whole_kv_bit_for_bit():
    """SplitKind.cut: inside the prefix, views of the base; past it, the base's and the
    tail's bytes in one buffer with a step of room; equal to the full cache's either way."""
    import mlx.core as mx

    from forkv.engine.cache.kinds.kv import SplitKind, SplitKV
    from mlx_lm.models.cache import KVCache

    rng = [mx.random.normal((1, 2, 300, 16)) for _ in range(2)]
    whole = KVCache()
    whole.update_and_fetch(rng[0], rng[1])
    base = KVCache()
    base.update_and_fetch(rng[0][..., :280, :], rng[1][..., :280, :])
    part = SplitKV(whole, base.keys[..., :260, :], base.values[..., :260, :], 260)
    assert part.p == 260 and part.offset == 300 and part.tail_keys.shape[2] == 40
    for u in (1, 259, 260, 261, 300):
        got = SplitKind.cut(part, KVCache(), 300, u)
        assert got.offset == u
        assert mx.array_equal(got.keys[..., :u, :], rng[0][..., :u, :]).item()
        assert mx.array_equal(got.values[..., :u, :], rng[1][..., :u, :]).item()
        k, v = got.update_and_fetch(rng[0][..., :1, :], rng[1][..., :1, :])  # still grows
        assert k.shape[2] == u + 1
    with pytest.raises(TypeError):
        SplitKind.cut(part, object(), 300, 10)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_next_turn_takes_the_siblings_prefix_along(arch, monkeypatch):
    """A document's first answer, a fork of it (a split entry over the first's K/V), then the
    first answer's next turn, whose entries the first's become views of: the fork's prefix is
    read from the new buffer too (`_rebase_splits`), so the old one goes; outputs are the
    same bits as without."""
    import gc

    import mlx.core as mx

    from forkv.engine.cache import live
    from forkv.engine.cache.kinds.kv import SplitKV

    lm = load_tiny(arch)
    doc = random_tokens(700, seed=60)

    def run(rebase: bool):
        if not rebase:
            monkeypatch.setattr(live.LivePool, "_rebase_splits", lambda self, new: None)
        fast = _engine(lm, reuse="fast")
        try:
            gc.collect()
            before = mx.get_active_memory()
            first = fast.generate(doc + random_tokens(20, seed=61), GREEDY)
            fork = fast.generate(doc + random_tokens(25, seed=62), GREEDY)
            nxt = fast.generate(doc + random_tokens(20, seed=61) + first.token_ids[:-1]
                                + random_tokens(30, seed=63), GREEDY)
            gc.collect()
            held = mx.get_active_memory() - before
            pool = fast.prefix.live
            splits = [e for e in pool.entries.values()
                      if any(isinstance(c, SplitKV) for c in e.cache)]
            assert splits
            outs = [(o.token_ids, o.logprobs) for o in (first, fork, nxt)]
            return outs, held
        finally:
            monkeypatch.undo()
            fast.close()

    outs_off, held_off = run(rebase=False)
    outs_on, held_on = run(rebase=True)
    assert outs_on == outs_off
    assert held_on < held_off
