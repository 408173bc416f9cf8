import pytest

from forkv.engine import GenerationError, SamplingParams
from forkv.engine.sampling import Sampler


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
