import pytest

import forkv
from conftest import load_tiny, scoped_engine
from forkv.engine import GenerationError, SamplingParams

MESSAGES = [{"role": "user", "content": "Tell me about block checkpoints. " * 4}]


def test_seeded_generation_is_deterministic(arch):
    engine = scoped_engine(load_tiny(arch))
    a = engine.generate(MESSAGES, max_tokens=12, temperature=0.9, seed=7)
    b = engine.generate(MESSAGES, max_tokens=12, temperature=0.9, seed=7)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.finish_reason == "length" and len(a.token_ids) == 12
    assert a.timings.prompt_tokens == len(engine.encode(MESSAGES))


def test_stream_events_add_up_to_result():
    engine = scoped_engine(load_tiny("gemma3"))
    events = list(engine.stream(MESSAGES, max_tokens=10, seed=3, temperature=1.0))
    result = engine.generate(MESSAGES, max_tokens=10, seed=3, temperature=1.0)
    assert "".join(e.text for e in events) == result.text
    assert sum((e.token_ids for e in events), []) == result.token_ids
    assert events[-1].finish_reason == "length" and events[-1].timings.generated_tokens == 10
    assert all(e.finish_reason is None for e in events[:-1])


def test_stop_string_ends_generation():
    engine = scoped_engine(load_tiny("qwen3"))
    full = engine.generate(MESSAGES, max_tokens=30, temperature=1.0, seed=11)
    stop = full.text[5:7]
    assert stop and stop not in full.text[:5]
    cut = engine.generate(MESSAGES, max_tokens=30, temperature=1.0, seed=11, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]


def test_eos_ends_generation():
    lm = load_tiny("qwen3")
    engine = scoped_engine(lm)
    greedy = engine.generate(MESSAGES, max_tokens=8)
    eos_lm = type(lm)(**{**{k: getattr(lm, k) for k in lm.__slots__},
                         "eos_token_ids": frozenset({greedy.token_ids[2]})})
    r = scoped_engine(eos_lm).generate(MESSAGES, max_tokens=8)
    first = greedy.token_ids.index(greedy.token_ids[2])
    assert r.finish_reason == "stop" and r.token_ids == greedy.token_ids[: first + 1]


def test_zero_max_tokens_and_bad_prompts():
    engine = scoped_engine(load_tiny("qwen3"))
    r = engine.generate("hello", max_tokens=0)
    assert r.token_ids == [] and r.finish_reason == "length"
    with pytest.raises(GenerationError, match="empty"):
        engine.generate("", max_tokens=4)
    with pytest.raises(GenerationError, match="context"):
        engine.generate("hi", SamplingParams(max_tokens=10**7))


def test_forkv_load_facade():
    with forkv.load("demo:qwen3:tiny") as engine:
        assert engine.generate("abc", max_tokens=3).finish_reason == "length"


def test_encode_takes_token_ids_of_any_integer_type_and_names_bad_ones():
    import numpy as np

    engine = scoped_engine(load_tiny("qwen3"))
    ids = engine.encode(MESSAGES)
    mine = list(ids)
    assert engine.encode(mine) == ids and engine.encode(mine) is not mine  # a copy of its own
    assert engine.encode(np.array(ids, np.int64)) == ids  # numpy ids come back as ints
    assert all(type(t) is int for t in engine.encode(list(np.array(ids, np.int32))))
    with pytest.raises(GenerationError, match="empty"):
        engine.encode([])
    with pytest.raises(GenerationError, match="None .NoneType. among its items"):
        engine.encode([1, None])
