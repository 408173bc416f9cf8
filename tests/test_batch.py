import time
import warnings

import numpy as np
import pytest
from conftest import ARCHS, TOLERANCE_KV, load_tiny, scoped_engine
from forkv.engine import Engine, ForkvWarning, SamplingParams
from forkv.engine import generate_batch
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request.generate import prefill
from helpers import fresh_logits, fresh_run, random_tokens

B = 64  # small blocks: decode crosses several boundaries (and gemma's window of 128 spans two)


def _engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    kw.setdefault("block_size", B)
    return scoped_engine(lm, **kw)


def _queue(engine) -> dict:
    return engine.stats()["queue"]


def _single(lm, prompt, **params):
    """The single-request reference, on its own fresh store."""
    return _engine(lm).generate(prompt, SamplingParams(**params))


def _assert_same(got, ref):
    assert got.token_ids == ref.token_ids
    assert got.text == ref.text and got.finish_reason == ref.finish_reason
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-4, rtol=0)


_runs = {}


@pytest.fixture(scope="module", autouse=True)
def _close_batch_runs():
    yield
    for _, engine, _, _ in _runs.values():
        engine.close()
    _runs.clear()


def _batch_run(arch, kv_dtype="auto"):
    """One batch per architecture (and K/V format): prompts of different lengths, one row
    restored from checkpoints, decode crossing block boundaries. Shared by the tests below."""
    if (arch, kv_dtype) not in _runs:
        lm = load_tiny(arch, kv_dtype=kv_dtype)
        engine = Engine(lm, store=RecordStore(1 << 30, None), block_size=B)  # for the module
        seen = random_tokens(200, seed=50)
        engine.generate(seen, max_tokens=1)  # records blocks 0..2
        prompts = [random_tokens(200, seed=51), random_tokens(37, seed=52),
                   seen[:150] + random_tokens(20, seed=53), random_tokens(130, seed=54)]
        results = generate_batch(engine, prompts, SamplingParams(max_tokens=36))
        engine.drain()  # the record jobs of the decoded blocks
        _runs[arch, kv_dtype] = lm, engine, prompts, results
    return _runs[arch, kv_dtype]


def test_batched_greedy_matches_single_request(arch):
    # (conftest: rows batched and alone compared within a tolerance)
    lm, _, prompts, results = _batch_run(arch, TOLERANCE_KV)
    for prompt, got in zip(prompts, results):
        _assert_same(got, _single(lm, prompt, max_tokens=36))
    restored = results[2].timings
    assert restored.reused_tokens == 128 and restored.computed_tokens == 170 - 128
    assert results[0].timings.reused_tokens == 0 and results[0].timings.prompt_tokens == 200


def test_checkpoints_recorded_in_batch_restore_exactly(arch):
    import mlx.core as mx

    lm, engine, prompts, results = _batch_run(arch)
    checked = 0
    for prompt, got in zip(prompts, results):
        history = prompt + got.token_ids
        # Boundaries reached while decoding inside the batch.
        for cut in range((len(prompt) // B + 1) * B, len(history), B):
            tokens = history[:cut] + random_tokens(5, seed=cut)
            r = engine.checkpointer.restore(tokens)
            assert r.position == cut, (arch, cut)
            logits = prefill(lm.model, r.cache, tokens, r.position, B)
            assert mx.array_equal(logits, fresh_logits(lm, tokens, B)).item(), (arch, cut)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_5"])
def test_default_blocks_wider_than_the_window(arch):
    """Block 256 > gemma's 128-token window: a decode boundary rebuilds the window from one
    block's tail. Rows cross 1024 while decoding; the records restore exactly."""
    import mlx.core as mx

    lm = load_tiny(arch)
    engine = _engine(lm, block_size=256)
    prompts = [random_tokens(1000, seed=55), random_tokens(300, seed=56)]
    params = SamplingParams(max_tokens=30)
    results = generate_batch(engine, prompts, params)
    engine.drain()  # the record jobs
    for prompt, got in zip(prompts, results):
        _assert_same(got, _engine(lm, block_size=256).generate(prompt, params))
    history = prompts[0] + results[0].token_ids
    if len(history) > 1024:
        tokens = history[:1024] + random_tokens(5, seed=57)
        r = engine.checkpointer.restore(tokens)
        logits = prefill(lm.model, r.cache, tokens, r.position, 256)
        assert r.position == 1024
        assert mx.array_equal(logits, fresh_logits(lm, tokens, 256)).item()


def test_records_released_mid_decode_are_recorded_again_by_the_job():
    """The prompt's records go while its row decodes: the row is untouched (no boundary work
    happens in a decode step), and its record job, finding nothing to restore, prefills from
    the start and records every block, exactly."""
    import mlx.core as mx

    lm = load_tiny("qwen3_5")
    engine = _engine(lm)
    seen = random_tokens(130, seed=58)
    engine.generate(seen, max_tokens=1)  # records 64 and 128
    with engine.paused():
        handle = engine.submit(seen[:130] + [7], max_tokens=70)  # restores 128, decodes past 192
        engine.step_once()
        assert _queue(engine)["running"] == 1
        engine.release(engine.block_keys(seen))
        recorded = engine.checkpointer.stats.blocks_recorded
    got = handle.result()
    engine.drain()
    assert got.timings.reused_tokens == 128
    assert engine.checkpointer.stats.blocks_recorded == recorded + 3  # 64, 128 again; 192
    _assert_same(got, fresh_run(lm, seen[:130] + [7], max_tokens=70))
    tokens = (seen[:130] + [7] + got.token_ids)[:192] + [3]
    r = engine.checkpointer.restore(tokens)
    assert r.position == 192
    logits = prefill(lm.model, r.cache, tokens, r.position, B)
    assert mx.array_equal(logits, fresh_logits(lm, tokens, B)).item()


def test_request_inserted_mid_flight_leaves_others_unchanged():
    lm = load_tiny("gemma3")
    prompts = [random_tokens(n, seed=60 + n) for n in (150, 90, 220)]
    engine = _engine(lm)
    with engine.paused():
        first = [engine.submit(p, max_tokens=30) for p in prompts[:2]]
        for _ in range(8):
            engine.step_once()
        assert _queue(engine)["running"] == 2
        late = engine.submit(prompts[2], max_tokens=30)
    alone = generate_batch(_engine(lm), prompts[:2], SamplingParams(max_tokens=30))
    for h, ref in zip(first, alone):
        _assert_same(h.result(), ref)
    _assert_same(late.result(), _single(lm, prompts[2], max_tokens=30))


def test_cancel_frees_the_row_without_disturbing_others():
    lm = load_tiny("qwen3_5")
    prompts = [random_tokens(n, seed=70 + n) for n in (80, 120, 60)]
    engine = _engine(lm)
    with engine.paused():
        handles = [engine.submit(p, max_tokens=24) for p in prompts]
        while _queue(engine)["running"] < 3:
            engine.step_once()
        for _ in range(4):
            engine.step_once()
        assert handles[1].cancel()
        engine.step_once()  # the cancel is applied before the step
        assert _queue(engine)["running"] == 2 and handles[1].done
        assert not handles[1].cancel()
    cancelled = handles[1].result()
    assert cancelled.finish_reason == "cancelled" and 0 < len(cancelled.token_ids) < 24
    for i in (0, 2):
        _assert_same(handles[i].result(), _single(lm, prompts[i], max_tokens=24))
    # A request cancelled before it starts never runs (the earlier rows' record jobs run
    # once the batch is empty: let them finish first).
    engine.drain(timeout=60)
    with engine.paused():
        queued = engine.submit(prompts[0], max_tokens=5)
        queued.cancel()
        assert queued.result(timeout=30).token_ids == []
        assert _queue(engine) == {"waiting": 0, "prefilling": 0, "running": 0, "record_jobs": 0}


def test_caps_admit_in_order():
    lm = load_tiny("qwen3")
    engine = _engine(lm, max_seqs=2, max_prefill_tokens=B)
    started, peak = [], 0
    with engine.paused():
        handles = [engine.submit(random_tokens(30 + 40 * i, seed=80 + i), max_tokens=6)
                   for i in range(4)]
        while not all(h.done for h in handles):
            report = engine.step_once()
            q = _queue(engine)
            peak = max(peak, q["prefilling"] + q["running"])
            assert peak <= 2 and report.prefill_tokens <= B
            started += [i for i in report.prefilled if i not in started]
    assert peak == 2 and started == [h.id for h in handles]  # FIFO admission
    for i, h in enumerate(handles):
        _assert_same(h.result(), _single(lm, h.prompt_tokens, max_tokens=6))


def test_long_prefills_take_turns_while_others_decode():
    lm = load_tiny("gemma3")
    engine = _engine(lm, max_prefill_tokens=B)
    with engine.paused():
        running = engine.submit(random_tokens(20, seed=100), max_tokens=60)
        engine.step_once()
        a, b = (engine.submit(random_tokens(300, seed=101 + i), max_tokens=2) for i in range(2))
        owners = []
        while not (a.done and b.done):
            report = engine.step_once()
            # One chunk per step at most, and the running row decodes on every step.
            assert report.prefill_tokens <= B and running.id in {s.id for s, _ in report.events}
            owners += list(report.prefilled)
    # Round-robin: the two long prompts alternate chunk by chunk (300 = 4 x 64 + 44), but a
    # prompt's last chunk goes first (its first token is one chunk away), and the one it
    # passed goes first the step after.
    assert owners == [a.id, b.id] * 3 + [a.id, a.id, b.id, b.id]
    _assert_same(running.result(), _single(lm, random_tokens(20, seed=100), max_tokens=60))


def test_sampling_stop_strings_and_eos_per_row():
    lm = load_tiny("qwen3")
    prompt = random_tokens(90, seed=110)
    full = _single(lm, prompt, max_tokens=30, temperature=1.0, seed=11)
    stop = full.text[5:7]
    greedy = _single(lm, prompt, max_tokens=8)
    eos_lm = type(lm)(**{**{k: getattr(lm, k) for k in lm.__slots__},
                         "eos_token_ids": frozenset({greedy.token_ids[2]})})
    params = [SamplingParams(max_tokens=30, temperature=1.0, seed=11),
              SamplingParams(max_tokens=30, temperature=1.0, seed=11, stop=(stop,)),
              SamplingParams(max_tokens=8), SamplingParams(max_tokens=0),
              SamplingParams(max_tokens=12, temperature=0.7, top_k=20, top_p=0.9, seed=3)]
    got = generate_batch(_engine(eos_lm), [prompt] * len(params), params)
    for g, p in zip(got, params):
        _assert_same(g, _engine(eos_lm).generate(prompt, p))
    assert got[1].finish_reason == "stop" and got[1].text == full.text[: full.text.index(stop)]
    assert got[2].finish_reason == "stop" and got[2].token_ids[-1] == greedy.token_ids[2]
    assert got[3].token_ids == [] and got[3].finish_reason == "length"


def test_stream_events_match_single_request_stream():
    lm = load_tiny("gemma4")
    prompt = [{"role": "user", "content": "Tell me about block checkpoints. " * 3}]
    no_eos = {t: -1e9 for t in lm.eos_token_ids}  # all 10 tokens, whatever the seed draws
    ref = list(_engine(lm).stream(prompt, max_tokens=10, temperature=0.8, seed=5,
                                  logit_bias=no_eos))
    engine = _engine(lm)
    other = engine.submit(random_tokens(50, seed=120), max_tokens=10)
    got = list(engine.submit(prompt, max_tokens=10, temperature=0.8, seed=5,
                             logit_bias=no_eos).stream())
    assert [(e.text, e.token_ids, e.finish_reason) for e in got] == [
        (e.text, e.token_ids, e.finish_reason) for e in ref]
    t = got[-1].timings
    assert t.generated_tokens == 10 and t.prompt_tokens == t.computed_tokens > 0
    assert other.result().finish_reason == "length"


def test_unmergeable_caches_run_one_at_a_time(monkeypatch):
    import forkv.engine.engine as engine_module

    lm = load_tiny("gemma3")
    monkeypatch.setattr(engine_module, "merge_blocker", lambda caches: "QuantizedKVCache")
    with pytest.warns(ForkvWarning, match="one at a time"):
        engine = _engine(lm)
    assert not engine.is_batched
    prompts = [random_tokens(n, seed=130 + n) for n in (100, 60)]
    with engine.paused():
        handles = [engine.submit(p, max_tokens=30) for p in prompts]
        while not all(h.done for h in handles):
            engine.step_once()
            q = _queue(engine)
            assert q["prefilling"] + q["running"] <= 1
    for h, p in zip(handles, prompts):
        _assert_same(h.result(), _single(lm, p, max_tokens=30))


def test_requests_from_many_threads_share_the_engine_thread():
    import threading

    lm = load_tiny("qwen3")
    prompts = [random_tokens(n, seed=140 + n) for n in (70, 30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _engine(lm) as engine:
            results = [None] * len(prompts)

            def ask(i):
                results[i] = engine.generate(prompts[i], max_tokens=12)

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            streamed = list(engine.submit(prompts[0], max_tokens=12).stream())
    for r, p in zip(results, prompts):
        _assert_same(r, _single(lm, p, max_tokens=12))
    assert [t for e in streamed for t in e.token_ids] == results[0].token_ids
    assert streamed[-1].timings.reused_tokens == 64  # its prefix blocks were recorded


def test_all_demo_architectures_are_batchable():
    for arch in ARCHS:
        assert _engine(load_tiny(arch)).is_batched


def test_a_failing_step_fails_every_request_and_empties_the_engine():
    lm = load_tiny("qwen3")
    engine = _engine(lm)
    with engine.paused():
        handles = [engine.submit(random_tokens(40, seed=150 + i), max_tokens=8) for i in range(2)]
        engine.step_once()

    def broken(*args, **kwargs):
        raise MemoryError("out of memory")

    real = engine.runner.decode
    engine.runner.decode = broken
    for h in handles:
        with pytest.raises(MemoryError):
            h.result()
    assert _queue(engine) == {"waiting": 0, "prefilling": 0, "running": 0, "record_jobs": 0}
    engine.runner.decode = real
    assert engine.submit(random_tokens(40, seed=150), max_tokens=3).result().token_ids


def test_a_batch_of_one_without_checkpoints_decodes_as_plain_mlx_lm():
    """The one request path adds nothing to a single greedy run: same tokens as mlx-lm's own
    generator (no decode boundary is recomputed without checkpoints)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    lm = load_tiny("gemma3")
    prompt = random_tokens(100, seed=160)
    got = fresh_run(lm, prompt, max_tokens=20)
    limit = len(lm.tokenizer.vocab)

    def mask(_, logits):
        return mx.where(mx.arange(logits.shape[-1]) < limit, logits, -mx.inf)

    steps = generate_step(mx.array(prompt), lm.model, max_tokens=20, logits_processors=[mask])
    ref = [int(t) for t, _ in steps]
    n = got.token_ids.index(next(iter(lm.eos_token_ids))) + 1 if set(
        got.token_ids) & lm.eos_token_ids else len(got.token_ids)
    assert got.token_ids == ref[:n]


def test_forks_of_one_prompt_compute_its_prefix_once():
    """n requests with the same prompt, submitted together: the first prefills, the others
    wait for it and restore every full block it recorded."""
    lm = load_tiny("qwen3")
    engine = _engine(lm)
    prompt = random_tokens(300, seed=170)
    handles = [engine.submit(prompt, max_tokens=4, temperature=1.0, seed=i) for i in range(4)]
    reused = [h.result().timings.reused_tokens for h in handles]
    assert reused == [0, 256, 256, 256]


def test_async_handles_and_progress():
    import asyncio

    lm = load_tiny("qwen3")
    engine = _engine(lm)
    prompt = random_tokens(200, seed=180)
    seen = []

    async def main():
        h = engine.submit(prompt, max_tokens=6, progress=lambda *a: seen.append(a))
        events = [e async for e in h]
        again = await engine.submit(prompt, max_tokens=6).aresult()
        # Leaving an async loop early cancels the request.
        h3 = engine.submit(prompt + [1], max_tokens=50)
        async for _ in h3:
            break
        return events, again, await h3.aresult()

    events, again, cut = asyncio.run(main())
    assert [t for e in events for t in e.token_ids] == again.token_ids
    assert events[-1].finish_reason == "length" and again.timings.reused_tokens == 192
    assert seen == [(64, 200, 0), (128, 200, 0), (192, 200, 0), (200, 200, 0)]
    assert cut.finish_reason == "cancelled" and len(cut.token_ids) < 50
    engine.close()
    from forkv.engine import EngineClosed

    with pytest.raises(EngineClosed, match="closed"):
        engine.submit(prompt, max_tokens=1)


def test_a_request_waits_only_for_the_blocks_it_shares():
    """A request that shares the first block of a long prompt being prefilled is admitted as
    soon as that block is recorded, not after the whole prefill."""
    lm = load_tiny("qwen3")
    engine = _engine(lm, max_prefill_tokens=B)
    long = random_tokens(6 * B, seed=190)
    short = long[:B] + random_tokens(20, seed=191)
    with engine.paused():
        a = engine.submit(long, max_tokens=2)
        b = engine.submit(short, max_tokens=2)
        first = engine.step_once()  # a prefills block 0; b waits for it
        assert list(first.prefilled) == [a.id] and _queue(engine)["waiting"] == 1
        # b is admitted, restores block 0 and prefills its tail before a's next chunk (its
        # first token is one chunk away)
        second = engine.step_once()
        assert list(second.prefilled) == [b.id]
        assert b.done and not a.done  # b decoded its two tokens in that same step
        assert list(engine.step_once().prefilled) == [a.id]  # a's turn, which b passed
    assert b.result().timings.reused_tokens == B
    assert a.result().timings.reused_tokens == 0


def test_a_short_request_gets_its_first_token_before_a_long_prompt_goes_on():
    """A short request arriving while a long prompt prefills gets its prefill and first token
    in the next step, ahead of the long prompt's next chunk (which goes first the step
    after); neither's tokens change."""
    lm = load_tiny("qwen3")
    engine = _engine(lm, max_prefill_tokens=B)
    long, short = random_tokens(6 * B, seed=210), random_tokens(20, seed=211)
    with engine.paused():
        a = engine.submit(long, max_tokens=3)
        engine.step_once()
        engine.step_once()
        b = engine.submit(short, max_tokens=3)
        report = engine.step_once()
        assert report.prefilled == {b.id: 20}
        assert [s.id for s, _ in report.events] == [b.id, b.id]  # its first token, then one
        assert list(engine.step_once().prefilled) == [a.id]  # a's turn, which b passed
    _assert_same(a.result(), _single(lm, long, max_tokens=3))
    _assert_same(b.result(), _single(lm, short, max_tokens=3))


def test_a_request_that_arrives_mid_step_is_let_in_before_more_chunks_and_the_decode():
    """When a request arrived during a step that prefills, the step prefills no further chunk
    (one at least) and leaves its decode to the next step, never two steps running; tokens do
    not change."""
    lm = load_tiny("qwen3")
    engine = _engine(lm, max_prefill_tokens=4 * B)
    running, long = random_tokens(20, seed=220), random_tokens(6 * B, seed=221)
    with engine.paused():
        r = engine.submit(running, max_tokens=8)
        engine.step_once()
        a = engine.submit(long, max_tokens=2)
        engine.scheduler.arrived = lambda: True  # as if a request came in during each step
        first, second = engine.step_once(), engine.step_once()
        assert (first.prefilled, first.decoded) == ({a.id: B}, 0)
        assert (second.prefilled, second.decoded) == ({a.id: B}, 1)
        engine.scheduler.arrived = lambda: False
        third = engine.step_once()
        assert (third.prefilled, third.decoded) == ({a.id: 4 * B}, 2)  # the rest, both rows
    _assert_same(r.result(), _single(lm, running, max_tokens=8))
    _assert_same(a.result(), _single(lm, long, max_tokens=2))


def test_an_engine_nobody_holds_ends_its_thread():
    import gc
    import threading
    import weakref

    engine = Engine(load_tiny("qwen3"), store=RecordStore(1 << 30, None))  # nobody closes it
    engine.generate(random_tokens(40, seed=200), max_tokens=2)
    thread, ref = engine._worker.thread, weakref.ref(engine)
    del engine
    # The engine thread may still be finishing the step that delivered the last token (its
    # frame holds the engine until the step ends); after that nothing may hold it.
    deadline = time.monotonic() + 30
    while gc.collect() is not None and ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ref() is None
    thread.join(timeout=30)
    assert not thread.is_alive() and thread not in threading.enumerate()


def test_record_jobs_wait_while_rows_decode_and_run_first_for_a_request_that_needs_them():
    """A finished row's record job does not run while other rows decode; a request that
    continues the finished row's text promotes it, waits for it, and restores its blocks."""
    lm = load_tiny("gemma3")
    engine = _engine(lm)
    first, other = random_tokens(100, seed=70), random_tokens(40, seed=71)
    no_eos = {t: -1e9 for t in lm.eos_token_ids}
    with engine.paused():
        a = engine.submit(first, max_tokens=40, logit_bias=no_eos)  # crosses 128 decoding
        b = engine.submit(other, max_tokens=120, logit_bias=no_eos)
        while not a.done:
            engine.step_once()
        assert _queue(engine)["record_jobs"] == 1 and _queue(engine)["running"] == 1
        for _ in range(3):
            assert engine.step_once().recomputed == 0  # b decodes; the job waits
        follow = first + a.result().token_ids + random_tokens(10, seed=72)
        c = engine.submit(follow, max_tokens=2)
        report = engine.step_once()  # the job's one chunk (block 1), then c is held for it
        assert report.recomputed == B and _queue(engine)["record_jobs"] == 0
    assert c.result().timings.reused_tokens == 128
    b.result()
    engine.drain()
    assert _queue(engine) == {"waiting": 0, "prefilling": 0, "running": 0, "record_jobs": 0}


def test_an_engine_that_is_never_idle_queues_a_bounded_number_of_record_jobs():
    # A 12-minute soak (8 clients, never idle) queued ~630 jobs and growing: the newest stay.
    from forkv.engine.cache.record_jobs import MAX_QUEUED, RecordJobs

    jobs = RecordJobs(lambda tokens, keyer: tokens, None, None, None, B)
    for i in range(MAX_QUEUED + 40):
        jobs.add([i], 1, None)
    assert len(jobs) == MAX_QUEUED
    assert [j.seq for j in jobs.queue] == [[i] for i in range(40, MAX_QUEUED + 40)]


def test_released_blocks_are_not_recorded_again_by_a_pending_job():
    lm = load_tiny("gemma3")
    engine = _engine(lm)
    prompt = random_tokens(100, seed=73)
    no_eos = {t: -1e9 for t in lm.eos_token_ids}
    with engine.paused():
        handle = engine.submit(prompt, max_tokens=40, logit_bias=no_eos)  # decodes past 128
        while not handle.done:
            engine.step_once()
        assert _queue(engine)["record_jobs"] == 1
        keys = engine.block_keys(prompt + handle.result().token_ids)
        assert engine.release(keys) > 0  # block 0's records, from the prompt's prefill
        assert _queue(engine)["record_jobs"] == 0
    engine.drain()
    assert engine.release(keys) == 0  # nothing came back


def test_a_first_token_reaches_its_client_before_the_step_decodes():
    """The first token, sampled from the prefill, is handed over before the same step's
    batched decode (which would add a whole decode step to every time to first token)."""
    lm = load_tiny("qwen3")
    engine = _engine(lm)
    order = []
    decode, deliver = engine.runner.decode, engine.scheduler.deliver

    def logged_decode(*a):
        order.append("decode")
        return decode(*a)

    def logged_deliver(events):
        order.append(("deliver", len(events)))
        return deliver(events)

    engine.runner.decode, engine.scheduler.deliver = logged_decode, logged_deliver
    with engine.paused():
        handle = engine.submit(random_tokens(40, seed=120), max_tokens=4)
        engine.step_once()
        assert order == [("deliver", 1), "decode"]
        assert not handle.done and handle.finish_reason is None
    engine.close()


def test_a_finished_rows_record_job_is_work_at_once_and_its_result_carries_the_keys():
    """A record job is scheduled work, due as soon as the batch is empty (no idle timer),
    and a result carries the block keys the engine planned for its prompt."""
    lm = load_tiny("gemma3")
    engine = _engine(lm)
    prompt = random_tokens(300, seed=74)
    no_eos = {t: -1e9 for t in lm.eos_token_ids}
    with engine.paused():
        handle = engine.submit(prompt, max_tokens=230, logit_bias=no_eos)  # decodes to 529
        while not handle.done:
            engine.step_once()
        assert _queue(engine)["record_jobs"] == 1 and engine.scheduler.has_work
        assert engine.step_once().recomputed == B  # one chunk of the job, in the next step
    assert handle.result().block_keys == engine.block_keys(prompt) != []
    engine.drain()
    assert not engine.scheduler.has_work


def test_record_jobs_wait_for_a_quiet_moment_unless_drained(monkeypatch):
    """A record job does not start in the gap between one client's requests (its chunk would
    hold the next one up); it runs once the engine has been quiet for JOB_SETTLE_S, or at
    once when the engine is drained."""
    from forkv.engine import engine as engine_module

    lm = load_tiny("gemma3")
    engine = _engine(lm)
    no_eos = {t: -1e9 for t in lm.eos_token_ids}
    monkeypatch.setattr(engine_module, "JOB_SETTLE_S", 3600.0)
    engine.generate(random_tokens(100, seed=75), max_tokens=40, logit_bias=no_eos)  # past 128
    assert _queue(engine)["record_jobs"] == 1
    engine.generate(random_tokens(20, seed=76), max_tokens=2)  # the next request: no job ran
    assert engine.stats()["steps"]["recomputed_tokens"] == 0 and _queue(engine)["record_jobs"] == 1
    engine.drain(timeout=60)
    assert _queue(engine)["record_jobs"] == 0 and engine.stats()["steps"]["recomputed_tokens"]
    monkeypatch.setattr(engine_module, "JOB_SETTLE_S", 0.0)  # quiet at once: jobs run alone
    engine.generate(random_tokens(100, seed=77), max_tokens=40, logit_bias=no_eos)
    for _ in range(600):
        if _queue(engine)["record_jobs"] == 0:
            break
        time.sleep(0.05)
    assert _queue(engine)["record_jobs"] == 0


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3_5"])
def test_a_lone_row_decodes_on_its_plain_caches_and_joins_a_batch_when_another_comes(arch):
    """A row decoding alone keeps mlx-lm's plain caches (no mask or offset arrays), is merged
    when a second row joins and taken out again when it is left alone; with forkv's kernels
    every token and logprob is the bits of the always-merged batch's."""
    from forkv.engine.request.batchcache import BatchCache

    lm = load_tiny(arch)
    prompts = [random_tokens(n, seed=90 + n) for n in (70, 110)]

    def run(solo: bool):
        engine = _engine(lm)
        sched = engine.scheduler
        if not solo:
            sched.batch = BatchCache(sched.batch.mergeable)
        kinds = []  # (rows decoding, whether their caches are merged) after each step

        def step():
            engine.step_once()
            if sched.batch.caches is not None:
                kinds.append((len(sched.rows), any(type(c).__name__.startswith("Batch")
                                                    for c in sched.batch.caches)))

        with engine.paused():
            first = engine.submit(prompts[0], max_tokens=24)
            while len(kinds) < 4:  # prefill, then a few steps decoding alone
                step()
            second = engine.submit(prompts[1], max_tokens=40)
            while not second.done:
                step()
        return first.result(), second.result(), kinds

    (a, b, kinds), (ra, rb, _) = run(True), run(False)
    assert not any(merged for rows, merged in kinds if rows == 1), kinds
    assert any(rows == 2 and merged for rows, merged in kinds), kinds
    assert kinds[-1][0] == 1, kinds  # the second row ran on alone, unmerged again
    exact = lm.kernels is not None
    for got, ref in ((a, ra), (b, rb)):
        assert got.token_ids == ref.token_ids
        if exact:
            assert got.logprobs == ref.logprobs
        else:
            np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-4, rtol=0)
