"""Speculative decoding changes no token: the same requests with speculation on and off give
the same tokens and logprobs, greedy and seeded, on sliding-window (Gemma 3), global-only
(Qwen 3), hybrid recurrent (Qwen 3.5) and the registry's real models; drafts are accepted and
rejected along the way (the test hands the request drafts that agree in part), and rejected
tokens leave nothing in any cache kind (the rows go on to the same tokens, past block
boundaries and wrapped windows). Plus the drafter's and the sampler's pieces on their own.
"""

from __future__ import annotations

import pytest
from conftest import scoped_engine
from forkv.engine import native
from forkv.engine.models.named import NAMED_MODELS
from forkv.engine.request.drafts import Drafter, DraftSources, NgramIndex, RecentOutputs

# Verifying is exact only on forkv's kernels; without them speculation stays off (and says so).
kernels = pytest.mark.skipif(native.load() is None, reason="speculation needs forkv's kernels: "
                             f"{native.status().reason}")

# A prompt that repeats itself, so prompt lookup drafts too.
_PROMPT = [5 + (i * 37) % 60 for i in range(40)] * 3


def _corrupt(tokens: list[int], every: int = 9) -> list[int]:
    """The tokens with every `every`-th one changed: drafts from it agree, then fail."""
    return [t if i % every else (t + 1) % 500 + 3 for i, t in enumerate(tokens)]


def _same(engine, prompt, n: int, **params):
    params.setdefault("logit_bias", {t: -100.0 for t in engine.lm.eos_token_ids})  # run long
    off = engine.generate(prompt, max_tokens=n, speculate="off", **params)
    runs = []
    # its own prompt and output; the right answer as a tree draft; drafts that agree in part
    # (in a namespace of their own, whose recent outputs hold no right answer)
    for drafts, ns in (([], None), ([off.token_ids], None), ([_corrupt(off.token_ids)], "x")):
        on = engine.generate(prompt, max_tokens=n, speculate="on", drafts=drafts,
                             namespace=ns, **params)
        assert on.token_ids == off.token_ids, (drafts and "with drafts", params)
        assert on.logprobs == off.logprobs
        assert on.finish_reason == off.finish_reason
        runs.append(on.timings)
    return runs


@kernels
@pytest.mark.parametrize("arch", [
    pytest.param("gemma3", marks=pytest.mark.slow),  # (5-6 s each: the fast suite keeps qwen3)
    "qwen3",
    pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_same_tokens_on_and_off(arch):
    # 300 tokens after a 120-token prompt: past a block boundary (256) and, on Gemma 3's
    # sliding layers, past their 128-token window
    engine = scoped_engine(f"demo:{arch}:tiny", max_seqs=1)
    assert engine.speculation("on") is None
    exact, partial = _same(engine, _PROMPT, 300)[1:]
    assert exact.accepted_tokens > 100
    assert partial.drafted_tokens > partial.accepted_tokens > 100  # taken, and some refused
    _same(engine, _PROMPT, 120, temperature=0.9, seed=11)
    _same(engine, _PROMPT, 60, temperature=0.7, top_p=0.9, seed=3, top_logprobs=3)


@kernels
def test_same_tokens_in_a_batch_and_with_records():
    # rows beside others decode one token a step (speculation waits); checkpoints recorded
    # while speculating restore to the same continuation
    engine = scoped_engine("demo:gemma3:tiny")
    long = {"max_tokens": 200, "logit_bias": {t: -100.0 for t in engine.lm.eos_token_ids}}
    off = engine.generate(_PROMPT, speculate="off", **long)
    handles = [engine.submit(_PROMPT, speculate="on", drafts=[off.token_ids], **long)
               for _ in range(2)]
    for h in handles:
        assert h.result().token_ids == off.token_ids
    alone = engine.generate(_PROMPT, speculate="on", drafts=[off.token_ids], **long)
    assert alone.token_ids == off.token_ids and alone.timings.accepted_tokens > 100
    engine.drain()
    long["max_tokens"] = 50
    again = engine.generate(_PROMPT + off.token_ids[:150], speculate="off", **long)
    assert again.timings.reused_tokens == 256  # the block decoded while speculating
    assert again.token_ids == off.token_ids[150:]


@kernels
def test_stops_inside_an_accepted_draft():
    engine = scoped_engine("demo:qwen3:tiny")
    bias = {t: -100.0 for t in engine.lm.eos_token_ids}
    off = engine.generate(_PROMPT, max_tokens=40, speculate="off", logit_bias=bias)
    on = engine.generate(_PROMPT, max_tokens=37, speculate="on", drafts=[off.token_ids],
                         logit_bias=bias)
    assert on.token_ids == off.token_ids[:37] and on.finish_reason == "length"
    assert on.timings.accepted_tokens > 20


def test_a_model_whose_chunks_are_not_exact_does_not_speculate(monkeypatch):
    # mlx-vlm's Gemma 3 attention left on mlx's kernels, whose sums depend on the rows
    pytest.importorskip("mlx_vlm")
    from forkv.engine.native import attention

    monkeypatch.setattr(attention, "_sdpa_functions", lambda: (attention._mlx_lm_sdpa(),))
    engine = scoped_engine("demo:gemma3_vl:tiny")
    assert "decode's bits" in engine.speculation("on") or native.load() is None
    r = engine.generate(_PROMPT, max_tokens=20, speculate="on", drafts=[_PROMPT])
    assert r.timings.drafted_tokens == 0


@kernels
def test_an_answer_made_without_speculation_is_a_draft_source_too():
    engine = scoped_engine("demo:qwen3:tiny")
    bias = {t: -100.0 for t in engine.lm.eos_token_ids}
    off = engine.generate(_PROMPT, max_tokens=60, speculate="off", logit_bias=bias)
    on = engine.generate(_PROMPT, max_tokens=60, speculate="on", logit_bias=bias)
    assert on.token_ids == off.token_ids and on.timings.accepted_tokens > 30


def test_off_and_bad_modes():
    engine = scoped_engine("demo:qwen3:tiny")
    r = engine.generate(_PROMPT, max_tokens=30, speculate="off", drafts=[_PROMPT])
    assert r.timings.drafted_tokens == 0
    with pytest.raises(Exception, match="speculate='sometimes' is not a mode"):
        engine.generate(_PROMPT, max_tokens=3, speculate="sometimes")


@kernels
@pytest.mark.parametrize("name", ["demo:qwen2_vl"])
def test_vision_models_same_tokens(name):
    # an image in the prompt (M-RoPE positions on Qwen2-VL); 32-token blocks, so decoding
    # crosses boundaries that a vision row recomputes canonically
    pytest.importorskip("mlx_vlm")
    import io

    import numpy as np
    from PIL import Image

    pixels = (np.random.RandomState(3).rand(168, 224, 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    prompt = [{"role": "user", "content": [
        {"type": "text", "text": "Look: "}, {"type": "image", "image": buf.getvalue()},
        {"type": "text", "text": "What is it? " * 3}]}]
    engine = scoped_engine(name, block_size=32)
    assert engine.speculation("on") is None
    _, exact, partial = _same(engine, prompt, 80)
    assert exact.accepted_tokens > 20 and partial.accepted_tokens > 0


@kernels
@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_models_same_tokens(name):
    if not NAMED_MODELS[name].is_local():
        pytest.skip(f"{name} is not on this machine (forkv pull {name})")
    engine = scoped_engine(name, max_seqs=1)
    assert engine.speculation("auto") is None  # on the kernels: on by default
    src = "\n".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(30))
    prompt = src + "\n# The same module again:\n" + src[:300]
    own, _, partial = _same(engine, prompt, 160)
    assert own.accepted_tokens > 50 and partial.drafted_tokens > partial.accepted_tokens
    _same(engine, prompt, 60, temperature=0.8, seed=5)


# -- the pieces ------------------------------------------------------------------------------
def test_index_finds_the_longest_most_recent_match():
    idx = NgramIndex()
    idx.add([1, 2, 3, 4, 9, 9])
    idx.add([7, 2, 3, 4, 5, 6])
    n, seq, end = idx.best([0, 7, 2, 3, 4])
    assert (n, seq[end:]) == (4, [5, 6])
    n, seq, end = idx.best([8, 2, 3, 4])  # a tie at three: the most recent wins
    assert seq[end:] == [5, 6]
    assert idx.best([1, 2]) is None and idx.best([3, 3, 3]) is None


def test_drafter_grows_with_its_tokens_and_backs_off():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    d = Drafter(tokens)
    assert d.draft(10) == []
    tokens += [1, 2, 3]
    assert d.draft(10) == [4, 5, 6, 7, 8, 1]  # 2 x the match length
    assert d.draft(2) == [4, 5]
    for _ in range(3):
        d.feedback(4, 0)
    assert d.draft(10) == []  # three misses in a row: a pause
    d.feedback(4, 4)
    assert d.cap >= 2


def test_a_drafter_is_quiet_while_it_cools_down_or_finds_nothing():
    # (the scheduler runs a quiet drafter's row ahead, and takes the step back if it drafts)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    d = Drafter(tokens)
    assert not d.quiet
    assert d.draft(10) == [] and not d.quiet  # one lookup found nothing
    tokens.append(9)
    assert d.draft(10) == [] and d.quiet  # two in a row
    tokens += [1, 2, 3]
    assert d.draft(10) == [4, 5, 6, 7, 8, 9] and not d.quiet  # (it guessed wrong)
    for _ in range(3):
        d.feedback(4, 0)
    for _ in range(4):  # three misses: four steps without drafting, each known in advance
        assert d.quiet and d.draft(10) == []
    # then it stays quiet (a refused draft lets its row run ahead) until a long match wakes it
    assert d.quiet and d.draft(10) == []
    tokens += [4, 5, 6, 7, 8, 9]
    assert d.draft(10) == [1, 2] and not d.quiet  # (the cap follows acceptance)


def test_a_quiet_drafter_whose_drafts_were_refused_wakes_for_long_matches_only():
    # its row's next step is queued: taking it back for a 3-token match seldom pays
    tokens = list(range(1, 21))
    d = Drafter(tokens)
    d.feedback(6, 1)  # most of its drafts refused
    tokens.append(30)
    assert d.draft(10) == [] and d.draft(10) == [] and d.quiet
    tokens += [1, 2, 3]
    assert d.draft(10) == [] and d.quiet  # a short match does not wake it
    tokens += [4, 5, 6]
    assert d.draft(10) == [7, 8, 9] and not d.quiet  # a 6-token one does (cap: acceptance)


def test_a_paced_drafter_rests_where_speculating_decodes_slower_than_plain_steps():
    # chatty text: drafts from 6-token matches mostly refused, each verify ~3 plain steps
    tokens = list(range(1, 41)) + list(range(1, 7))
    d = Drafter(tokens)
    assert d.draft(10)  # a 6-token match
    d.spent(0.030, 1, plain_s=0.010)  # a refused draft: 2 plain steps lost
    assert not d.quiet
    d.spent(0.030, 1, plain_s=0.010)  # two: past the debt allowed
    for _ in range(4):  # a rest, as for misses
        assert d.quiet and d.draft(10) == []
    assert d.draft(10) == []  # and a 6-token match drafts no more: it takes 12
    tokens += list(range(7, 13))
    assert d.draft(10)

    # where speculating pays, or before any plain step was timed, it keeps drafting
    fast = Drafter(list(range(1, 41)) + list(range(1, 7)))
    for _ in range(4):
        fast.spent(0.015, 8, plain_s=0.010)
        fast.spent(0.050, 4, plain_s=None)
    fast.spent(0.030, 1, plain_s=0.010)  # a refused draft spends banked credit
    fast.spent(0.030, 1, plain_s=0.010)
    assert not fast.quiet and fast.draft(10)
    # and speculate="on" (unpaced) never rests for time
    forced = Drafter(list(range(1, 41)) + list(range(1, 7)), paced=False)
    for _ in range(4):
        forced.spent(0.090, 6, plain_s=0.010)
    assert forced.draft(10)


def test_pace_times_plain_steps_and_hands_speculating_ones_to_the_drafter():
    from forkv.engine.request.pace import Pace

    spent = []

    class Row:
        class drafter:  # noqa: N801 (a stand-in for Drafter)
            @staticmethod
            def spent(seconds, tokens, plain_s):
                spent.append((round(seconds, 3), tokens, plain_s))

    row, other, pace = Row(), Row(), Pace()
    pace.step_done(row, 1.000, 1, False, True)  # the first step starts the clock only
    assert pace.plain_s is None
    pace.step_done(row, 1.010, 1, False, True)
    pace.step_done(row, 1.030, 2, False, True)
    assert pace.plain_s == pytest.approx(0.010)
    pace.step_done(row, 1.060, 3, True, True)  # a verify
    pace.step_done(row, 1.075, 1, False, True)  # the step after it could not run ahead
    assert spent == [(0.03, 3, pytest.approx(0.01)), (0.015, 1, pytest.approx(0.01))]
    pace.step_done(row, 1.200, 1, False, False)  # a boundary record shared the step
    pace.forget()  # a prefill came between
    pace.step_done(row, 1.500, 1, False, True)
    pace.step_done(other, 1.510, 1, False, True)  # another row: no interval
    pace.step_done(None, 1.520, 2, False, True)  # a batch's step
    pace.step_done(other, 1.530, 1, False, True)
    assert len(spent) == 2 and pace.plain_s == pytest.approx(0.010)


def test_namespaces_draft_from_their_own_outputs_only():
    sources = DraftSources()
    sources.finished("a", [7, 8, 9, 10, 11, 12, 13, 14, 15], prompt_len=3)
    mine = sources.drafter([1, 10, 11, 12], [], "a")
    theirs = sources.drafter([1, 10, 11, 12], [], "b")
    assert mine.draft(5) == [13, 14, 15]
    assert theirs.draft(5) == []
    again = sources.drafter([5, 7, 8, 9], [], "a")  # the same prompt: drafts from its start
    assert again.draft(5) == [10, 11, 12, 13, 14]


def test_recent_outputs_stay_bounded():
    recent = RecentOutputs(max_tokens=100)
    for i in range(50):
        recent.add(list(range(i * 30, i * 30 + 30)))
    assert sum(len(s) for s in recent.index.seqs.values()) <= 100
    assert recent.index.best([1470, 1471, 1472]) is not None
    assert recent.index.best([0, 1, 2]) is None
    # evicted outputs' keys are pruned: at most 3 keys a token kept or dropped since a prune
    assert recent.index.num_entries <= 2 * 3 * 100


def test_all_namespaces_together_stay_bounded():
    # A soak with 16 tenants on two models grew ~800 bytes a token in 32 namespaces of 64K
    # tokens each (GiBs at the cap); the total is now bounded and the oldest namespace gives way.
    sources = DraftSources(max_tokens=100, max_total=250)
    for i in range(40):
        sources.finished(f"t{i % 8}", list(range(i * 50, i * 50 + 60)), prompt_len=10)
        kept = sum(r.tokens for r in sources._recent.values())
        assert kept == sources.total <= 250
    newest = sources.drafter([0, 1950, 1951, 1952], [], "t7")  # the last output drafts
    assert newest.draft(3) == [1953, 1954, 1955]
    oldest = sources.drafter([0, 1, 2, 3], [], "t0")  # the first was given up
    assert oldest.draft(3) == []
    alone = DraftSources(max_tokens=100, max_total=150)
    for i in range(10):
        alone.finished("a", list(range(i * 90, i * 90 + 90)), prompt_len=0)
        assert alone.total <= 150


def test_the_recent_outputs_total_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FORKV_RECENT_TOKENS", "300")
    assert DraftSources().max_total == 300 and DraftSources().max_tokens == 300
    monkeypatch.setenv("FORKV_RECENT_TOKENS", "lots")
    with pytest.raises(ValueError, match="FORKV_RECENT_TOKENS='lots' is not a token count"):
        DraftSources()


def test_the_recent_outputs_index_holds_under_a_hundred_bytes_a_token():
    import random
    import tracemalloc

    rng = random.Random(0)
    weights = [1 / (i + 1) for i in range(30000)]  # text-like: a few tokens are most of it
    outputs = [rng.choices(range(30000), weights, k=300) for _ in range(200)]
    tracemalloc.start()
    try:
        recent = RecentOutputs()
        for tokens in outputs:
            recent.add(tokens)
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # ~60 in numpy logs; 320 in a dict of boxed ints, 810 with tuple keys and hits
    assert used / recent.tokens < 100, used / recent.tokens


def test_draws_ahead_are_the_draws_decode_takes():
    import mlx.core as mx
    from forkv.engine.request.sampling import Sampler, SamplingParams

    logits = mx.random.normal((64,), key=mx.random.key(0))
    params = SamplingParams(temperature=1.0, seed=42)
    one, ahead = Sampler(params), Sampler(params)
    plain = [one(logits)[0].item() for _ in range(6)]
    looked = [ahead(logits, ahead=i)[0].item() for i in range(4)]
    ahead.advance(2)
    rest = [ahead(logits, ahead=i)[0].item() for i in range(4)]
    assert looked == plain[:4] and rest == plain[2:6]


@kernels
def test_a_regenerated_node_drafts_from_its_sibling():
    # Session: a second answer to the same turn (a sibling) drafts from the first one's tokens,
    # in a namespace whose recent outputs do not hold them, and gives the same text
    import forkv

    engine = scoped_engine("demo:qwen3:tiny")
    bias = {t: -100.0 for t in engine.lm.eos_token_ids}
    gen = {"max_tokens": 80, "logit_bias": bias, "speculate": "on"}
    with forkv.Session(engine, namespace="a") as session:
        user = session.system("Be brief.").user("Count to ten.")
        first = user.final(gen)
        session.run(first)
    with forkv.Session(engine, tree=session.tree, namespace="b") as other:
        again = other.tree[user.id].final(gen)  # node objects belong to the tree
        other.run(again)
    assert again.result.token_ids == first.result.token_ids
    assert again.result.stats.tokens_accepted > 40


@kernels
@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_a_refused_drafter_runs_ahead_and_changes_no_token(arch):
    # Drafts from a source with every 4th token changed fail at their first token, so the
    # drafter goes quiet (it cools down, or wakes for long matches only); its row then runs its
    # steps ahead (ahead.py) as a row without one does, and none of its tokens or logprobs
    # change.
    from helpers import random_tokens

    engine = scoped_engine(f"demo:{arch}:tiny", max_seqs=1)
    assert engine.scheduler.runs_ahead
    prompt = random_tokens(40, seed=41)
    bias = {t: -100.0 for t in engine.lm.eos_token_ids}
    sched, real = engine.scheduler, engine.scheduler._runs_ahead
    # seeded: greedy tiny demo models loop, so their drafts are accepted and never cool down
    for i, params in enumerate(({"temperature": 1.0, "seed": 4},
                                {"temperature": 0.9, "top_p": 0.95, "seed": 5})):
        off = engine.generate(prompt, max_tokens=100, speculate="off", logit_bias=bias,
                              **params)
        ran = []

        def spy(rows):
            ok = real(rows)
            ran.append(ok and rows[0].drafter is not None and rows[0].drafter.quiet)
            return ok

        sched._runs_ahead = spy
        try:
            on = engine.generate(prompt, max_tokens=100, speculate="on", logit_bias=bias,
                                 drafts=[_corrupt(off.token_ids, 4)], namespace=f"c{i}",
                                 **params)
        finally:
            del sched._runs_ahead
        assert on.token_ids == off.token_ids and on.logprobs == off.logprobs
        assert on.timings.drafted_tokens > 0 and sum(ran) > 10
