"""No body makes the server fail: generated and mutated JSON bodies at every POST endpoint of a
real `forkv serve` (demo:qwen3:tiny) are answered 200 or a 4xx in the OpenAI error format,
never a 5xx, and the server still answers afterwards. Bodies start from a valid request, then
get a field set to any JSON value (at any depth, deeply nested ones and 64-bit extremes among
them) or dropped, and the text may be cut or get a stray character. 150 bodies an endpoint
(FORKV_FUZZ_EXAMPLES for more), a few seconds in all."""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_proc import TINY, http, shared_server

MODEL = "demo:qwen3:tiny"
VALID = {
    "/v1/chat/completions": {
        "model": MODEL, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    "/v1/completions": {"model": MODEL, "prompt": ["hi", [1, 2]], "max_tokens": 2, "n": 1},
    "/v1/responses": {
        "model": MODEL, "max_output_tokens": 2, "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
}
# fields any endpoint may get, beside the ones its valid body has
FIELDS = ["model", "stream", "stream_options", "n", "seed", "temperature", "top_p", "top_k",
          "stop", "logit_bias", "logprobs", "top_logprobs", "echo", "best_of", "suffix",
          "presence_penalty", "frequency_penalty", "cache_salt", "speculate", "tools",
          "tool_choice", "response_format", "text", "reasoning", "previous_response_id",
          "store", "metadata", "include", "max_completion_tokens", "max_tokens",
          "max_output_tokens", "parallel_tool_calls", "truncation", "user"]


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


EXTREMES = st.sampled_from([
    -(1 << 63), (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 64), 10 ** 30, -1, 0, 1.5, 1e308,
    -1e308, 5e-324, float("nan"), float("inf"), "", "\x00", "\ud800", "😀" * 3, " " * 3, {}, [],
    _nested(63), _nested(65), "<deep 2000>", "<deep 10000>",
    {"type": "image_url", "image_url": {"url": "x"}},
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {"role": "assistant", "content": None, "tool_calls": [{"id": 1}]},
    "data:image/png;base64,AAAA", "http://example.com/a.png"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
VALUES = st.one_of(EXTREMES, st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                     st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6))


def _paths(value, path=()):
    """Every (container path, key) in `value`, the top-level fields first."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, inner in items:
        yield path, key
        if isinstance(inner, (dict, list)):
            yield from _paths(inner, (*path, key))


@st.composite
def bodies(draw, endpoint: str) -> bytes:
    body = json.loads(json.dumps(VALID[endpoint]))
    for _ in range(draw(st.integers(1, 3))):
        inside = list(_paths(body))  # the body's own fields, at any depth, as often as new ones
        path, key = draw(st.one_of(st.sampled_from(inside), st.sampled_from(FIELDS).map(
            lambda f: ((), f)))) if inside else ((), draw(st.sampled_from(FIELDS)))
        holder = body
        for step in path:
            holder = holder[step]
        if draw(st.integers(0, 4)) == 0:  # drop it
            if isinstance(holder, dict):
                holder.pop(key, None)
            elif key < len(holder):
                holder.pop(key)
        elif isinstance(holder, dict) or key < len(holder):
            holder[key] = copy.deepcopy(draw(VALUES))  # (EXTREMES' own stay as they are)
    if draw(st.integers(0, 9)) == 0:
        body = copy.deepcopy(draw(VALUES))  # not an object at all
    text = json.dumps(body)  # (NaN and Infinity as Python writes them; the server parses them)
    for n in (2000, 10_000):  # too deep for a Python object here: written out as text
        text = text.replace(f'"<deep {n}>"', "[" * n + "]" * n)
    mutation = draw(st.integers(0, 5))
    if mutation == 0 and text:  # cut short
        text = text[:draw(st.integers(0, len(text) - 1))]
    elif mutation == 1:  # a stray character
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(list('[]{}",:0-e.\\'))) + text[at:]
    return text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


@pytest.mark.parametrize("endpoint", list(VALID))
def test_no_body_gets_a_5xx(url, endpoint):
    seen: dict[int, int] = {}

    @settings(max_examples=int(os.environ.get("FORKV_FUZZ_EXAMPLES", "150")), deadline=None,
              database=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies(endpoint))
    def check(body):
        status, payload = http("POST", url + endpoint, body)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (status, body[:300], payload)
        if status != 200:
            assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
            assert payload["error"]["message"], payload

    check()
    status, payload = http("GET", f"{url}/health")
    assert status == 200 and payload["status"] == "ok"
    assert seen.get(200, 0) > 0 and sum(n for s, n in seen.items() if s >= 400) > 0, seen


@pytest.mark.parametrize("endpoint", list(VALID))
def test_the_bodies_found_to_fail_before(url, endpoint):
    status, payload = http("POST", url + endpoint, b"[" * 10_000)
    assert status == 400 and "levels deep" in payload["error"]["message"], payload
    status, payload = http("POST", url + endpoint, json.dumps(VALID[endpoint])[:-1].encode()
                           + b', "metadata": ' + b"[" * 10_000 + b"]" * 10_000 + b"}")
    assert status == 400 and payload["error"]["param"] == "metadata", payload
    status, payload = http("POST", url + endpoint, {**VALID[endpoint], "stop": _nested(70)})
    assert status == 400 and payload["error"]["param"] == "stop", payload
    for seed in (-(1 << 63), (1 << 63) - 1, -1):  # OpenAI's seed: any 64-bit integer
        status, payload = http("POST", url + endpoint, {**VALID[endpoint], "seed": seed, "n": 2})
        assert status == 200, (seed, payload)
    status, payload = http("POST", url + endpoint, {**VALID[endpoint], "seed": 1 << 63})
    assert status == 400 and payload["error"]["param"] == "seed", payload
    # a lone surrogate escape is valid JSON but no text (the tokenizer raised: a 500)
    raw = json.dumps(VALID[endpoint])[:-1].encode() + b', "instructions": "a\\ud800b"}'
    status, payload = http("POST", url + endpoint, raw)
    assert status == 400 and payload["error"]["param"] == "instructions", payload
    assert "surrogate" in payload["error"]["message"], payload


def test_a_responses_role_that_is_no_string(url):
    status, payload = http("POST", f"{url}/v1/responses",
                           {"model": MODEL, "input": [{"role": [], "content": "hi"}]})
    assert status == 400 and payload["error"]["param"] == "input[0]", payload
