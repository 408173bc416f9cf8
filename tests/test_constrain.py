"""Constrained decoding: every sampled output matches its constraint, whatever the logits."""

import json
import re

import jsonschema
import pytest
from forkv.engine import GenerationError, SamplingParams
from forkv.engine.demo.models import ensure_demo_model
from forkv.engine.request.constrain import Constraint, RowMatcher, as_constraint
from forkv.engine.request.sampling import Sampler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok():
    from mlx_lm.tokenizer_utils import load

    return load(ensure_demo_model("qwen3", "tiny"))


def _sample(tok, constraint, seed, vocab=512, max_tokens=200, temperature=1.0):
    """Draw from random logits (a random model at its worst) through the sampler."""
    import mlx.core as mx

    params = SamplingParams(temperature=temperature, seed=seed, constraint=constraint)
    sampler = Sampler(params, vocab, prompt_len=3, tokenizer=tok)
    tokens = [1, 2, 3]
    key = mx.random.key(seed)
    for _ in range(max_tokens):
        key, sub = mx.random.split(key)
        token = int(sampler(mx.random.normal((vocab,), key=sub) * 4, tokens)[0].item())
        if token in tok.eos_token_ids:
            return tok.decode(tokens[3:]), True
        tokens.append(token)
    return tok.decode(tokens[3:]), False


def test_json_schema_is_honoured_in_every_sample_at_temperature_1(tok):
    for seed in range(30):
        text, ended = _sample(tok, Constraint.json_schema(SCHEMA), seed)
        assert ended, text
        jsonschema.validate(json.loads(text), SCHEMA)
        # written as json.dumps writes it, so a chat template re-renders the same tokens
        assert text == json.dumps(json.loads(text), ensure_ascii=False)


def test_regex_grammar_and_json_object(tok):
    for seed in range(5):
        text, _ = _sample(tok, Constraint.regex(r"[0-9]{3}-[a-z]{2}"), seed)
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
        text, _ = _sample(tok, Constraint.grammar('start: "yes" | "no" | "maybe"'), seed)
        assert text in ("yes", "no", "maybe")
    # any object: strings are unbounded, so a random model may not finish one; if it ends,
    # it ended on a complete object
    text, ended = _sample(tok, Constraint.json_object(), 0, max_tokens=100)
    assert text.startswith("{") and (not ended or isinstance(json.loads(text), dict))


def test_greedy_and_padded_vocab(tok):
    """Greedy picks the best allowed token; ids past the tokenizer's vocabulary never win."""
    import mlx.core as mx

    sampler = Sampler(SamplingParams(constraint=Constraint.regex("ab")), 512, 0, tok)
    logits = mx.zeros((512,)) + mx.array([0.0] * 500 + [100.0] * 12)
    assert tok.decode([int(sampler(logits, [])[0].item())]) == "a"


def test_after_a_complete_match_only_end_of_sequence_is_allowed(tok):
    m = RowMatcher(Constraint.regex("ok"), tok)
    allowed = m.allowed(tok.encode("ok", add_special_tokens=False))
    assert m.is_accepting
    assert set(allowed.nonzero()[0].tolist()) == set(tok.eos_token_ids)


def test_constraint_forms_and_errors(tok):
    c = Constraint.json_schema(SCHEMA)
    assert as_constraint(("json_schema", c.spec)) == c
    assert as_constraint({"json_schema": SCHEMA}) == c
    assert as_constraint({"regex": "a+"}) == Constraint.regex("a+")
    assert SamplingParams(constraint=("regex", "a+")).constraint == Constraint.regex("a+")

    class Graphish:  # the graph's Constraint: any object with kind and spec
        kind, spec = "regex", "a+"

    assert as_constraint(Graphish()) == Constraint.regex("a+")
    with pytest.raises(GenerationError, match="unknown"):
        Constraint("xml", "x")
    with pytest.raises(GenerationError, match="needs its regex"):
        Constraint("regex")
    with pytest.raises(GenerationError, match="not understood"):
        as_constraint(42)
    with pytest.raises(GenerationError, match="tokenizer"):
        Sampler(SamplingParams(constraint=c), 512, 0)
    with pytest.raises(GenerationError, match="does not compile"):
        RowMatcher(Constraint.grammar("start: undefined_rule"), tok)
    with pytest.raises(GenerationError, match="not valid JSON"):
        RowMatcher(Constraint("json_schema", "{nope"), tok)


def test_unconstrained_rows_are_untouched(tok):
    import mlx.core as mx

    logits = mx.random.normal((512,), key=mx.random.key(0))
    a = Sampler(SamplingParams(), 512, 0, tok)(logits, [])[1]
    b = Sampler(SamplingParams(), 512, 0)(logits, [])[1]
    assert mx.array_equal(a, b)
