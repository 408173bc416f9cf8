"""forkv serve, chat completions, through the official openai client against a real server
process on loopback (demo:qwen3:tiny): completions, streaming, n > 1, logprobs, cached
tokens, 16 concurrent streams, a disconnect that frees its row, and bad input as JSON errors."""

from __future__ import annotations

import http.client as httpclient
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

openai = pytest.importorskip("openai")

from server_proc import TINY, http, metric, no_eos, shared_server  # noqa: E402

from forkv import arenas  # noqa: E402

MODEL = "demo:qwen3:tiny"
LONG = "The quick brown fox jumps over the lazy dog. " * 14  # ~630 byte tokens: 2 full blocks


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completion_and_cached_tokens(client):
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": LONG + "What jumps?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                           temperature=0)
    choice = first.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert first.usage.prompt_tokens > 512
    assert 1 <= first.usage.completion_tokens <= 6
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                           temperature=0)
    # The second request restores the prompt's full blocks from the first one's checkpoints.
    assert again.usage.prompt_tokens_details.cached_tokens >= 512
    assert again.choices[0].message.content == choice.message.content


def test_stream_matches_completion_and_reports_usage(client):
    messages = [{"role": "user", "content": "Count: one two three"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_n_choices_share_the_prompt(client, url):
    computed = metric(url, "forkv_tokens_computed_total")
    forks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Forks: " + LONG}], n=3,
        max_tokens=2, temperature=1.0)
    assert len(forks.choices) == 3
    # The prompt is computed once: the other two forks restore its full blocks.
    prompt = forks.usage.prompt_tokens
    assert metric(url, "forkv_tokens_computed_total") - computed < 2 * prompt
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Three ideas?"}], n=3,
        max_tokens=8, temperature=1.0, seed=7)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert 3 <= out.usage.completion_tokens <= 24
    assert len({c.message.content for c in out.choices}) >= 2  # seeds differ per choice
    streamed = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
        stream=True))
    assert {c.choices[0].index for c in streamed if c.choices} == {0, 1}


def test_choices_and_repeats_of_a_prompt_restore_it_whole(client, url):
    """A chat prompt ends at the generation prompt, where its turn end is recorded with the
    last logits: the other choices of n > 1 and a repeat of the request compute nothing."""
    messages = [{"role": "user", "content": "Whole: " + LONG}]
    computed = metric(url, "forkv_tokens_computed_total")
    forks = client.chat.completions.create(model=MODEL, messages=messages, n=3, max_tokens=2,
                                           temperature=1.0)
    prompt, cached = forks.usage.prompt_tokens, forks.usage.prompt_tokens_details.cached_tokens
    assert prompt % 256 and cached < prompt
    # Only the first choice computes (the rest of) the prompt.
    assert metric(url, "forkv_tokens_computed_total") - computed == prompt - cached
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens == prompt


def test_logprobs(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and isinstance(item.token, str)
        assert len(item.top_logprobs) == 2
        # Greedy: the chosen token is the most likely one.
        assert abs(item.top_logprobs[0].logprob - item.logprob) < 1e-4


def test_sixteen_concurrent_streams(client):
    def one(i: int) -> tuple[str, str | None]:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"client {i}"}], max_tokens=8,
            temperature=0, stream=True)
        text, finish = [], None
        for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return "".join(text), finish

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert all(finish in ("stop", "length") for _, finish in results)


def test_disconnect_mid_stream_frees_the_row(url):
    cancelled = metric(url, "forkv_requests_cancelled_total")
    conn = httpclient.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 4000, "stream": True, "logit_bias": no_eos(MODEL)}
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
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
    assert metric(url, "forkv_requests_running") == 0
    assert metric(url, "forkv_requests_cancelled_total") >= cancelled + 1


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    ({"model": MODEL}, 400, "missing_required_parameter"),
    ({"model": MODEL, "messages": []}, 400, "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, 404,
     "model_not_found"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 6},
     400, "context_length_exceeded"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9},
     400, "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     400, "image_not_supported"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 300_000}]}, 413,
     "request_too_large"),
])
def test_bad_input_is_an_openai_error(url, body, status, code):
    got, payload = http("POST", f"{url}/v1/chat/completions", body)
    assert got == status, payload
    error = payload["error"]
    assert error["code"] == code and error["message"] and error["type"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_huge_max_tokens_is_blamed_on_its_field(client, field):
    # The prompt is short: the 400 names the field that overflows the context, not messages.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       **{field: 10 ** 9})
    assert e.value.code == "context_length_exceeded" and e.value.param == field


def test_errors_through_the_client_and_no_500(client, url):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=10 ** 6)
    assert e.value.code == "context_length_exceeded"
    status, payload = http("GET", f"{url}/v1/nothing-here")
    assert status == 404 and payload["error"]["code"] == "not_found"
    assert metric(url, "forkv_requests_total", 'endpoint="chat",status="500"') == 0


def test_speculation_changes_no_token_and_is_counted(client, url):
    # the second request drafts from the first one's output (its namespace's recent outputs)
    body = {"model": MODEL, "max_tokens": 120, "temperature": 0,
            "messages": [{"role": "user", "content": "Count: 1 2 3 4 5 6 7 8 9 10"}]}
    bias = {"logit_bias": no_eos(MODEL)}
    off = client.chat.completions.create(**body, extra_body={"speculate": "off", **bias})
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
    runs = [client.chat.completions.create(**body, extra_body={"speculate": "on", **bias})
            for _ in range(2)]
    for on in runs:
        assert on.choices[0].message.content == off.choices[0].message.content
    details = runs[1].usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 50
    assert details.rejected_prediction_tokens >= 0
    assert metric(url, "forkv_tokens_drafted_total") >= details.accepted_prediction_tokens
    _, text = http("GET", f"{url}/metrics")  # steps taken back: exposed (test_ahead counts)
    assert any(line.startswith("forkv_steps_taken_back_total ") for line in text.splitlines())
    status, _ = http("POST", f"{url}/v1/chat/completions", {**body, "speculate": "maybe"})
    assert status == 400


def test_models_health_metrics(client, url):
    assert MODEL in [m.id for m in client.models.list().data]
    # the K/V format the loaded model caches in (demo qwen3:tiny: head_dim 16, no q8_0)
    assert client.models.retrieve(MODEL).kv_dtype in ("float16", "bfloat16", "float32")
    assert http("GET", f"{url}/health")[0] == 200
    _, text = http("GET", f"{url}/metrics")
    for name in ("forkv_requests_total", "forkv_tokens_reused_total",
                 "forkv_tokens_computed_total", "forkv_tokens_generated_total",
                 "forkv_record_hits_total", "forkv_record_misses_total", "forkv_tier_bytes",
                 "forkv_queue_depth", "forkv_time_to_first_token_seconds_bucket"):
        assert f"\n{name}" in text or text.startswith(name), name
    assert metric(url, "forkv_tokens_generated_total") > 0
    assert metric(url, "forkv_time_to_first_token_seconds_count") > 0
    parts = {line.split('part="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
             for line in text.splitlines() if line.startswith("forkv_memory_bytes{")}
    glibc = {"malloc_in_use", "malloc_free"} if arenas.usage() else set()
    assert set(parts) == {"rss", "mlx_active", "mlx_cache", "live"} | glibc, parts
    assert parts["rss"] > parts["mlx_active"] > 0 and parts["mlx_active"] >= parts["live"]
    if glibc:  # mlx's CPU buffers come from malloc
        assert parts["malloc_in_use"] >= parts["mlx_active"] * 0.9 and parts["malloc_free"] >= 0


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(-1, 3),
                    st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3),
                    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_MESSAGES = st.one_of(_VALUES, st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x", 3]),
     "content": st.one_of(st.text(max_size=20), st.none(), st.integers(), st.lists(
         st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio"]),
                                "text": _VALUES, "image_url": _VALUES}), max_size=2))}),
    max_size=3))
_BODIES = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "", "other"]), "messages": _MESSAGES,
     "max_tokens": st.one_of(st.integers(-2, 3), st.text(max_size=3))},
    optional={k: _VALUES for k in ("n", "stream", "temperature", "top_p", "top_k", "stop",
                                   "seed", "logprobs", "top_logprobs", "stream_options",
                                   "cache_salt", "max_completion_tokens")})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_BODIES)
def test_no_body_crashes_the_server(url, body):
    status, payload = http("POST", f"{url}/v1/chat/completions", body)
    assert status in (200, 400, 404), (status, body, payload)
    if status != 200:
        assert set(payload["error"]) == {"message", "type", "param", "code"}
