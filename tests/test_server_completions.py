"""forkv serve, legacy completions (POST /v1/completions), through the official openai client
against a real server process on loopback (demo:qwen3:tiny): text and token-id prompts, several
prompts with n > 1, streaming, stop, logprobs, echo, cached tokens, usage, a disconnect that
cancels, and bad input as JSON errors naming the field."""

from __future__ import annotations

import http.client as httpclient
import json
import time

import pytest

openai = pytest.importorskip("openai")

from server_proc import TINY, http, metric, no_eos, shared_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
LONG = "The quick brown fox jumps over the lazy dog. " * 14  # ~630 byte tokens: 2 full blocks


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ban_eos():
    return {"logit_bias": no_eos(MODEL)}  # every completion runs to max_tokens


def _greedy(client, prompt, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, temperature=0, **kw)


def test_text_prompt_and_usage(client, ban_eos):
    out = _greedy(client, "hello world", extra_body=ban_eos)  # max_tokens left out: 16
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.model == MODEL and len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0 and isinstance(choice.text, str) and choice.logprobs is None
    assert choice.finish_reason == "length"
    usage = out.usage
    assert usage.prompt_tokens == len("hello world")  # the demo tokenizer: one token a byte
    assert usage.completion_tokens == 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_token_ids_are_the_same_prompt(client, ban_eos):
    text = _greedy(client, "hello world", max_tokens=6, extra_body=ban_eos)
    ids = _greedy(client, list(b"hello world"), max_tokens=6, extra_body=ban_eos)
    assert ids.choices[0].text == text.choices[0].text
    assert ids.usage.prompt_tokens == text.usage.prompt_tokens


def test_several_prompts_times_n(client, ban_eos):
    prompts = ["one two", list(b"three four")]
    out = _greedy(client, prompts, n=2, max_tokens=4, extra_body=ban_eos)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt_index * n + choice
    texts = [c.text for c in out.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3]  # greedy: choices of a prompt agree
    assert texts[0] == _greedy(client, "one two", max_tokens=4, extra_body=ban_eos).choices[0].text
    assert out.usage.prompt_tokens == len("one two") + len("three four")  # once per prompt
    assert out.usage.completion_tokens == 4 * 4


def test_stream_matches_completion_and_reports_usage(client):
    whole = _greedy(client, "Count: one two three", max_tokens=12)
    chunks = list(client.completions.create(
        model=MODEL, prompt="Count: one two three", max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_of_several_choices(client, ban_eos):
    chunks = list(client.completions.create(
        model=MODEL, prompt=["a", "b"], n=2, max_tokens=3, stream=True, extra_body=ban_eos))
    texts: dict[int, str] = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert set(texts) == {0, 1, 2, 3}


def test_stop(client, ban_eos):
    whole = _greedy(client, "Stop here:", max_tokens=16, extra_body=ban_eos).choices[0].text
    # A character the model writes after its first one (the random model writes some ASCII).
    stop = next(ch for ch in whole[1:] if ch.isascii())
    out = _greedy(client, "Stop here:", max_tokens=16, stop=[stop], extra_body=ban_eos)
    assert out.choices[0].text == whole[:whole.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_logprobs(client, ban_eos):
    out = _greedy(client, "hello", max_tokens=5, logprobs=2, extra_body=ban_eos)
    lp = out.choices[0].logprobs
    n = out.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == n == 5
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert isinstance(token, str) and logprob <= 0
        assert 1 <= len(top) <= 2  # two ids may decode to one text (a byte piece)
        assert abs(max(top.values()) - logprob) < 1e-4  # greedy: the most likely token
    zero = _greedy(client, "hello", max_tokens=2, logprobs=0).choices[0].logprobs
    assert len(zero.token_logprobs) == len(zero.tokens) and all(t == {} for t in zero.top_logprobs)
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=MODEL, prompt="hello", max_tokens=5, temperature=0, logprobs=2, stream=True,
        extra_body=ban_eos) if c.choices and c.choices[0].logprobs]
    assert [x for s in streamed for x in s.token_logprobs] == pytest.approx(lp.token_logprobs)
    assert [x for s in streamed for x in s.text_offset] == lp.text_offset


def test_echo(client, ban_eos):
    plain = _greedy(client, "Echo me", max_tokens=4, extra_body=ban_eos).choices[0].text
    out = _greedy(client, "Echo me", max_tokens=4, echo=True, extra_body=ban_eos)
    assert out.choices[0].text == "Echo me" + plain
    ids = _greedy(client, list(b"Echo me"), max_tokens=4, echo=True, extra_body=ban_eos)
    assert ids.choices[0].text == "Echo me" + plain
    chunks = client.completions.create(model=MODEL, prompt="Echo me", max_tokens=4,
                                       temperature=0, echo=True, stream=True, extra_body=ban_eos)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Echo me" + plain


def test_repeated_long_prompt_is_cached(client):
    first = _greedy(client, LONG + "What jumps?", max_tokens=4)
    assert first.usage.prompt_tokens > 512
    again = _greedy(client, LONG + "What jumps?", max_tokens=4)
    # The second request restores the prompt's full blocks from the first one's checkpoints.
    assert again.usage.prompt_tokens_details.cached_tokens >= 512
    assert again.choices[0].text == first.choices[0].text


def test_disconnect_mid_stream_cancels(url):
    cancelled = metric(url, "forkv_requests_cancelled_total")
    conn = httpclient.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    body = {"model": MODEL, "prompt": ["go on", "and on"], "max_tokens": 4000, "stream": True,
            "logit_bias": no_eos(MODEL)}
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(20).startswith(b"data: ")  # generation is under way
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 20
    while metric(url, "forkv_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(url, "forkv_requests_in_flight") == 0
    assert metric(url, "forkv_requests_cancelled_total") >= cancelled + 2


@pytest.mark.parametrize("fields, param, code", [
    ({}, "prompt", "missing_required_parameter"),
    ({"prompt": ""}, "prompt", "invalid_value"),
    ({"prompt": []}, "prompt", "invalid_value"),
    ({"prompt": ["ok", ""]}, "prompt[1]", "invalid_value"),
    ({"prompt": [[1, 2], []]}, "prompt[1]", "invalid_value"),
    ({"prompt": [5, 10 ** 6]}, "prompt[1]", "invalid_value"),
    ({"prompt": [[5], [6, -1]]}, "prompt[1][1]", "invalid_value"),
    ({"prompt": [["a"]]}, "prompt[0]", "invalid_value"),
    ({"prompt": {"text": "x"}}, "prompt", "invalid_value"),
    ({"prompt": "x", "logprobs": 6}, "logprobs", "invalid_value"),
    ({"prompt": "x", "best_of": 3}, "best_of", "unsupported_value"),
    ({"prompt": "x", "suffix": "end"}, "suffix", "unsupported_value"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "echo", "unsupported_value"),
    ({"prompt": "x", "temperature": 9}, "temperature", "invalid_value"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"prompt": "x", "max_tokens": 10 ** 9}, "max_tokens", "context_length_exceeded"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty", "invalid_value"),
    ({"prompt": "x", "n": 0}, "n", "invalid_value"),
])
def test_bad_input_names_the_field(url, fields, param, code):
    status, payload = http("POST", f"{url}/v1/completions", {"model": MODEL, **fields})
    assert status == 400, payload
    error = payload["error"]
    assert error["param"] == param and error["code"] == code, error
    assert error["message"] and error["type"] == "invalid_request_error"


def test_defaults_of_other_fields_are_accepted(client):
    out = client.completions.create(
        model=MODEL, prompt="x", max_tokens=2, best_of=1, suffix=None, presence_penalty=0,
        frequency_penalty=0, user="someone", seed=3, extra_body={"cache_salt": "s"})
    assert len(out.choices) == 1


def test_errors_through_the_client(client, url):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="")
    assert e.value.param == "prompt" and "empty" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", logprobs=9)
    assert e.value.param == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", best_of=4)
    assert e.value.param == "best_of" and "best_of" in e.value.message
    assert metric(url, "forkv_requests_total", 'endpoint="completions",status="200"') > 0
    assert metric(url, "forkv_requests_total", 'endpoint="completions",status="500"') == 0
