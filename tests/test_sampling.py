import pytest
from forkv.engine import GenerationError, SamplingParams
from forkv.engine.request.sampling import Sampler


def _logits():
    import mlx.core as mx

    return mx.array([0.0, 3.0, 1.0, 2.9, -1.0, 2.0])


def test_greedy_picks_argmax():
    token, logprobs = Sampler(SamplingParams(temperature=0))(_logits())
    assert token.item() == 1
    import mlx.core as mx

    assert abs(mx.exp(logprobs).sum().item() - 1) < 1e-5


def test_seed_reproduces_and_differs():
    def draw(seed):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed))
        return [s(_logits())[0].item() for _ in range(30)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    # any 64-bit seed, OpenAI's signed range included (-1 was a TypeError in mlx's key)
    assert draw(-1) == draw(-1) and draw(-(1 << 63)) == draw(1 << 63)
    assert draw(-1) != draw(1) and draw((1 << 64) - 1) == draw(-1)
    for bad in (1 << 64, -(1 << 63) - 1):
        with pytest.raises(GenerationError, match="64 bits"):
            SamplingParams(seed=bad)


def test_top_k_and_top_p_restrict_support():
    s = Sampler(SamplingParams(temperature=5.0, top_k=2, seed=0))
    assert {s(_logits())[0].item() for _ in range(50)} <= {1, 3}
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.05, seed=0))
    assert {s(_logits())[0].item() for _ in range(20)} == {1}


def test_vocab_limit_masks_padding_ids():
    s = Sampler(SamplingParams(temperature=0), vocab_limit=1)
    assert s(_logits())[0].item() == 0


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                    dict(top_k=-1), dict(max_tokens=-2), dict(stop=("",))])
def test_bad_params(kwargs):
    with pytest.raises(GenerationError):
        SamplingParams(**kwargs)


def test_stop_accepts_a_string():
    assert SamplingParams(stop="END").stop == ("END",)


def test_min_p_keeps_tokens_near_the_top():
    import math

    # exp(2.9 - 3.0) ~ 0.905 of the top token: min_p=0.5 keeps {1, 3}, 0.95 keeps {1} only.
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=0))
    assert {s(_logits())[0].item() for _ in range(60)} == {1, 3}
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.95, seed=0))
    assert {s(_logits())[0].item() for _ in range(20)} == {1}
    assert math.isclose(SamplingParams(min_p=1).min_p, 1.0)


def test_logit_bias_moves_the_greedy_pick_and_reads_json_keys():
    s = Sampler(SamplingParams(logit_bias={"4": 10.0}))  # a JSON object's string key
    token, logprobs = s(_logits())
    assert token.item() == 4 and logprobs[4].item() > -0.01  # logprobs include the bias
    with pytest.raises(GenerationError, match="vocabulary has 6 tokens"):
        Sampler(SamplingParams(logit_bias={6: 1.0}), vocab_limit=6)


def test_penalties_look_back_over_recent_tokens():
    # Token 1 (3.0) just appeared: each penalty pushes greedy decoding to token 3 (2.9).
    for kw in (dict(repetition_penalty=1.5), dict(presence_penalty=0.5),
               dict(frequency_penalty=0.2)):
        s = Sampler(SamplingParams(**kw))
        assert s(_logits(), [0, 1])[0].item() == 3, kw
        assert s(_logits(), [0, 2])[0].item() == 1, kw  # not seen: no penalty
    # frequency counts repeats: 0.06 per occurrence, two of them overtake the 0.1 gap.
    s = Sampler(SamplingParams(frequency_penalty=0.06))
    assert s(_logits(), [1])[0].item() == 1 and s(_logits(), [1, 1])[0].item() == 3
    # only the last `penalty_context` tokens count
    s = Sampler(SamplingParams(presence_penalty=0.5, penalty_context=2))
    assert s(_logits(), [1, 0, 2])[0].item() == 1


def test_top_logprobs_lists_the_most_likely_ids_in_order():
    from forkv.engine.request.sampling import top_logprobs

    _, logprobs = Sampler(SamplingParams())(_logits())
    top = top_logprobs(logprobs, 3)
    assert list(top) == [1, 3, 5]
    assert all(abs(top[i] - logprobs[i].item()) < 1e-6 for i in top)
    assert top_logprobs(logprobs, 0) == {} and len(top_logprobs(logprobs, 99)) == 6
    assert SamplingParams(top_logprobs=5).top_logprobs == 5


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature="hot"), "temperature must be a number >= 0"),
    (dict(top_k=1.5), "top_k must be an integer"),
    (dict(min_p=2), "min_p must be a number >= 0.0 and <= 1.0"),
    (dict(repetition_penalty=0), "repetition_penalty must be a number > 0.0"),
    (dict(top_logprobs=50), "top_logprobs must be an integer >= 0 and <= 20"),
    (dict(logit_bias={"x": 1}), "logit_bias entry 'x'"),
    (dict(logit_bias=[1]), "logit_bias must map"),
    (dict(seed="7"), "seed must be an integer"),
    (dict(stop=[1]), "stop must be a non-empty string"),
    (dict(max_tokens=float("nan")), "max_tokens must be an integer"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(GenerationError) as e:
        SamplingParams(**kwargs)
    assert field in str(e.value) and str(e.value).endswith(".")


@pytest.mark.parametrize("kw", [
    {"temperature": 0}, {"temperature": 0.8, "seed": 3}, {"temperature": 1.3, "seed": 4},
    {"temperature": 0.7, "seed": 5, "logit_bias": {7: 4.0}, "top_logprobs": 3},
    {"temperature": 0.9, "seed": 6, "frequency_penalty": 0.4},
    {"temperature": 0.9, "seed": 7, "top_k": 5}])  # a filter: not fused, the same route
def test_draw_rows_draws_what_the_sampler_draws_alone(lib, kw):
    """A batch's draws (one native call where the samplers are fused) are the bits of each
    row's own `Sampler.__call__`, at the next draw and at positions ahead, with the padded
    ids of a vocab_limit never drawn; both take the same keys."""
    import mlx.core as mx

    from forkv.engine.request.sampling import draw_rows

    logits = mx.random.normal((4, 4099), key=mx.random.key(9)) * 3
    history = [1, 7, 7, 2]

    def samplers():
        return [Sampler(SamplingParams(**kw), vocab_limit=4000, kernels=lib) for _ in range(4)]

    alone, batch = samplers(), samplers()
    assert all(s.fused for s in batch) == ("top_k" not in kw)
    for at in (None, 0, 2):
        want = [s(logits[i], history, ahead=at) for i, s in enumerate(alone)]
        tokens, picked, full = draw_rows(logits, [(s, history, at) for s in batch])
        assert tokens.tolist() == [t.item() for t, _ in want]
        assert picked.tolist() == [lp[t].item() for t, lp in want]
        assert max(tokens.tolist()) < 4000
        for f, (_, lp) in zip(full, want):
            assert (f is None) == (not kw.get("top_logprobs")) or "top_k" in kw
            if f is not None:
                assert mx.array_equal(f, lp).item()
    if kw.get("temperature"):  # the next draws used the same keys on both sides
        assert all(mx.array_equal(a._key, b._key).item() for a, b in zip(alone, batch))


def test_a_batch_of_unlike_rows_draws_as_each_row_alone(lib):
    """Rows with biases of different widths, none, a penalty (drawn from a prepared row) and
    greedy or sampled in one batch: each row's draw is its own sampler's."""
    import mlx.core as mx

    from forkv.engine.request.sampling import draw_rows

    kws = [{"temperature": 0.9, "seed": 1, "logit_bias": {3: 2.0, 40: -1.0, 41: 5.0}},
           {"temperature": 0, "logit_bias": {5: 9.0}}, {"temperature": 1.1, "seed": 2},
           {"temperature": 0.6, "seed": 3, "presence_penalty": 0.7}]
    logits = mx.random.normal((4, 3001), key=mx.random.key(4)) * 2
    history = [5, 41, 41]
    for drop in (3, None):  # without the penalised row (natively biased), then with it
        params = kws[:drop]
        alone = [Sampler(SamplingParams(**kw), kernels=lib) for kw in params]
        batch = [Sampler(SamplingParams(**kw), kernels=lib) for kw in params]
        want = [s(logits[i], history) for i, s in enumerate(alone)]
        tokens, picked, _ = draw_rows(logits[:len(params)], [(s, history, None) for s in batch])
        assert tokens.tolist() == [t.item() for t, _ in want]
        assert picked.tolist() == [lp[t].item() for t, lp in want]
