"""Decode steps run ahead (engine/request/ahead.py): the rows' next step is queued before their
tokens are read back. No token or logprob changes; a row that stops takes the step ahead back out
of the caches (the next turn continues that cache as if it never ran; in a batch the other rows
decode that step again); a request that arrives meanwhile joins the batch after it."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import load_tiny
from forkv.engine import Engine, SamplingParams, native
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.request import scheduler as scheduler_module
from helpers import fresh_run, random_tokens


def _engine(lm, ahead: bool, **kw) -> Engine:
    engine = Engine(lm, store=RecordStore(1 << 30, None), speculate="off", **kw)
    engine.scheduler.runs_ahead = ahead
    return engine


@pytest.fixture
def count_ahead(monkeypatch):
    """How many decode steps were queued ahead."""
    counts = [0]
    runs_ahead = scheduler_module.Scheduler._runs_ahead

    def spy(self, rows):
        ok = runs_ahead(self, rows)
        counts[0] += ok
        if ok and len(rows) > 1:
            counts.append(len(rows))  # a batch's step queued ahead
        return ok

    monkeypatch.setattr(scheduler_module.Scheduler, "_runs_ahead", spy)
    return counts


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=300, temperature=0),  # crosses block 256 (recorded there)
    SamplingParams(max_tokens=60, temperature=0.8, top_p=0.9, seed=7),
    SamplingParams(max_tokens=40, temperature=0, repetition_penalty=1.3),  # never ahead
], ids=["greedy", "seeded", "penalty"])
def test_running_ahead_changes_no_token(arch, params, count_ahead):
    lm = load_tiny(arch)
    prompt = random_tokens(40, seed=31)
    got = {}
    for ahead in (False, True):
        with _engine(lm, ahead) as engine:
            got[ahead] = engine.generate(prompt, params)
    assert got[True].token_ids == got[False].token_ids
    assert got[True].logprobs == got[False].logprobs
    assert (count_ahead[0] > 0) == (params.repetition_penalty == 1.0)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_row_that_stops_takes_the_step_ahead_back(arch, count_ahead):
    lm = load_tiny(arch)
    prompt = random_tokens(40, seed=32)
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=8)  # (greedy ones loop)
    free = fresh_run(lm, prompt, params)
    ids = free.token_ids
    end = next(i for i in range(4, len(ids)) if ids[i] not in ids[:i]) + 1
    stop = ids[end - 1]
    # the same model with that token as its end of sequence
    lm = dataclasses.replace(lm, eos_token_ids=frozenset({stop}))
    got = {}
    for ahead in (False, True):
        with _engine(lm, ahead, reuse="fast") as engine:
            first = engine.generate(prompt, params)
            assert first.finish_reason == "stop" and first.token_ids == free.token_ids[:end]
            fed = prompt + first.token_ids[:-1]  # the last sampled token is never fed
            second = engine.generate(fed + random_tokens(20, seed=33), max_tokens=8,
                                     temperature=0)
            assert second.timings.reused_tokens == len(fed)  # the finished row's cache
            got[ahead] = second
    assert count_ahead[0] > 0
    assert got[True].token_ids == got[False].token_ids
    assert got[True].logprobs == got[False].logprobs


def test_a_request_arriving_meanwhile_joins_after_the_step_ahead(count_ahead):
    lm = load_tiny("qwen3")
    a, b = random_tokens(30, seed=34), random_tokens(50, seed=35)
    with _engine(lm, True) as engine, engine.paused():
        ra = engine.submit(a, max_tokens=20, temperature=0)
        for _ in range(4):
            engine.step_once()
        assert engine.scheduler._ahead is not None
        rb = engine.submit(b, max_tokens=10, temperature=0)
        while not (ra.done and rb.done):
            engine.step_once()
    assert count_ahead[0] > 0
    for r, prompt, n in ((ra, a, 20), (rb, b, 10)):
        want = fresh_run(lm, prompt, max_tokens=n, temperature=0)
        got = r.result()
        assert got.token_ids == want.token_ids and got.logprobs == want.logprobs


def test_a_row_cancelled_with_a_step_ahead_leaves_the_engine_exact(count_ahead):
    lm = load_tiny("qwen3")
    a, b = random_tokens(30, seed=36), random_tokens(30, seed=37)
    with _engine(lm, True) as engine:
        with engine.paused():
            ra = engine.submit(a, max_tokens=20, temperature=0)
            for _ in range(4):
                engine.step_once()
            assert engine.scheduler._ahead is not None
            ra.cancel()
            engine.run_on_thread(lambda: None)  # (the cancel, posted, has run)
            assert ra.result().finish_reason == "cancelled"
            assert engine.scheduler._ahead is None and not engine.scheduler.rows
        got = engine.generate(b, max_tokens=10, temperature=0)
    want = fresh_run(lm, b, max_tokens=10, temperature=0)
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 1.0, "seed": 21}], ids=["greedy", "seeded"])
def test_a_batch_runs_ahead_and_rows_that_stop_or_cancel_leave_the_rest_exact(arch, sampling,
                                                                             count_ahead):
    # Four rows of different prompt lengths decode as one batch whose steps are queued ahead.
    # One row stops on a token of its own text (made the end of sequence), another is
    # cancelled while a step is queued: each time the whole queued step is taken back and the
    # rows left decode it again. Every row gives what the same batch gives in lockstep.
    lm = load_tiny(arch)
    prompts = [random_tokens(n, seed=40 + n) for n in (20, 33, 47, 26)]
    params = SamplingParams(max_tokens=40, **sampling)
    alone = fresh_run(lm, prompts[0], params).token_ids
    # a token first seen past the 6th (a greedy tiny model loops: else the 7th's first place)
    end = next((i for i in range(6, len(alone)) if alone[i] not in alone[:i]),
               alone.index(alone[6])) + 1
    lm = dataclasses.replace(lm, eos_token_ids=frozenset({alone[end - 1]}))
    got, queued, taken = {}, {}, {}
    for ahead in (False, True):
        with _engine(lm, ahead) as engine, engine.paused():
            handles = [engine.submit(p, params) for p in prompts]
            steps = 0
            while not all(h.done for h in handles):
                engine.step_once()
                steps += 1
                if steps == 5:  # (prefill took the first step)
                    assert not handles[3].done
                    queued[ahead] = engine.scheduler._ahead is not None
                    handles[3].cancel()
                    engine.run_on_thread(lambda: None)  # (the cancel, posted, has run)
            got[ahead] = [h.result() for h in handles]
            taken[ahead] = engine.scheduler.totals.taken_back
    assert queued == {False: False, True: True}
    assert taken[False] == 0 and taken[True] >= 1  # the cancel's queued step, counted
    assert got[True][0].finish_reason == "stop"
    assert [r.finish_reason for r in got[True]][3] == "cancelled"
    for a, b in zip(got[True], got[False]):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        assert a.finish_reason == b.finish_reason
    assert max(count_ahead[1:], default=0) >= 3  # a batch of rows ran ahead


# Verifying is exact only on forkv's kernels; without them speculation stays off.
kernels = pytest.mark.skipif(native.load() is None, reason="speculation needs forkv's kernels")


@kernels
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 0.9, "top_p": 0.95, "seed": 12}],
                         ids=["greedy", "seeded"])
def test_a_drafter_that_wakes_takes_the_step_ahead_back(arch, sampling):
    # A row whose drafter finds nothing runs ahead; the text then starts repeating a draft
    # source (the answer from its 30th token on), so the drafter drafts while a step is
    # queued: that step is taken back (cache and sampler key) and the row verifies instead.
    # Same tokens and logprobs as speculation off, and as speculation in lockstep.
    lm = load_tiny(arch)
    prompt = random_tokens(40, seed=38)
    params = dict(max_tokens=100, logit_bias={t: -100.0 for t in lm.eos_token_ids}, **sampling)
    with _engine(lm, True) as engine:
        off = engine.generate(prompt, **params)
    source = off.token_ids[30:]
    got, taken = {}, {}
    for ahead in (False, True):
        with Engine(lm, store=RecordStore(1 << 30, None), speculate="on") as engine:
            engine.scheduler.runs_ahead = ahead
            got[ahead] = engine.generate(prompt, drafts=[source], **params)
            taken[ahead] = engine.scheduler.totals.taken_back
    for r in got.values():
        assert r.token_ids == off.token_ids and r.logprobs == off.logprobs
        assert r.timings.accepted_tokens > 30
    assert got[True].timings.drafted_tokens == got[False].timings.drafted_tokens
    assert taken[False] == 0 and taken[True] > 0
