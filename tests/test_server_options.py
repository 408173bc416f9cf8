"""forkv serve's options against real server processes: refusing a non-loopback address
without a key, API keys as tenants whose checkpoints never serve each other, `cache_salt`,
a full queue answering 429, and reasoning items for a thinking format."""

from __future__ import annotations

import http.client as httpclient
import json
import subprocess
import sys

import pytest

openai = pytest.importorskip("openai")

from server_proc import metric, no_eos, running_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
PROMPT = [{"role": "user", "content": "Tenant data: " + "secret plans " * 25}]


def test_refuses_other_addresses_without_a_key():
    out = subprocess.run([sys.executable, "-m", "forkv.cli", "serve", "--model", MODEL,
                          "--host", "0.0.0.0", "--port", "1"], capture_output=True, text=True,
                         timeout=60, env=_env())
    assert out.returncode == 2
    assert "--api-key" in out.stderr and "0.0.0.0" in out.stderr


def test_help_lists_the_endpoints_and_the_default_address():
    out = subprocess.run([sys.executable, "-m", "forkv.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0
    for endpoint in ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses",
                     "/v1/responses/{id}", "GET /v1/models", "/health", "/metrics"):
        assert endpoint in out.stdout, endpoint
    assert "127.0.0.1:8000" in out.stdout and "(default 8000)" in out.stdout
    assert "(default 127.0.0.1" in out.stdout and "--quiet" in out.stdout


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "FORKV_API_KEY"}


@pytest.fixture(scope="module")
def url():
    with running_server("--model", MODEL, "--api-key", "key-a", "--api-key", "key-b",
                        "--max-queue", "2", "--reasoning",
                        "on") as u:
        yield u


def _client(url, key):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_keys_are_required(url):
    with pytest.raises(openai.AuthenticationError):
        _client(url, "wrong").models.list()
    conn = httpclient.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
    conn.request("GET", "/v1/models")
    resp = conn.getresponse()
    assert resp.status == 401 and json.loads(resp.read())["error"]["code"] == "invalid_api_key"
    assert [m.id for m in _client(url, "key-a").models.list().data][0] == MODEL


def _cached(client, **extra) -> int:
    out = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2, **extra)
    return out.usage.prompt_tokens_details.cached_tokens


def test_tenants_and_salts_never_share_checkpoints(url):
    a, b = _client(url, "key-a"), _client(url, "key-b")
    _cached(a)
    assert _cached(a) >= 256  # the same tenant reuses its own prompt
    assert _cached(b) == 0  # another key: its own namespace, nothing to restore
    assert _cached(a, extra_body={"cache_salt": "s1"}) == 0  # a salt is its own namespace
    assert _cached(a, extra_body={"cache_salt": "s1"}) >= 256
    resp = a.responses.create(model=MODEL, input="mine", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(resp.id)
    assert a.responses.retrieve(resp.id).id == resp.id
    # one engine for all of them (no engine per namespace to close): the namespaces are counted
    assert metric(url, "forkv_namespaces", key="key-a") >= 3


def test_logit_bias(url):
    client = _client(url, "key-a")
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         max_tokens=6, logit_bias={"7": 100}, logprobs=True)
    assert [t.token for t in out.choices[0].logprobs.content] == \
        [out.choices[0].logprobs.content[0].token] * 6  # token 7, every time
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         max_tokens=40, temperature=2, logit_bias=no_eos(MODEL))
    assert out.choices[0].finish_reason == "length"
    for bias, field in (({"abc": 1}, "logit_bias"), ({"7": 101}, "logit_bias"),
                        ({"99999999": 1}, None)):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, max_tokens=2, logit_bias=bias,
                                           messages=[{"role": "user", "content": "x"}])
        assert "logit_bias" in str(e.value) and (field is None or e.value.param == field)


def test_full_queue_answers_429(url):
    port = int(url.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(2):  # fill the queue (--max-queue 2) with streams that cannot end early
            conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/chat/completions", json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "go"}],
                 "max_tokens": 4000, "stream": True,
                 "logit_bias": no_eos(MODEL)}),
                {"Content-Type": "application/json", "Authorization": "Bearer key-a"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read(6) == b"data: "
            held.append(conn)
        with pytest.raises(openai.RateLimitError) as e:
            _client(url, "key-b").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert e.value.code == "queue_full"
    finally:
        for conn in held:
            conn.sock.close()
            conn.close()


def test_reasoning_items_for_a_thinking_format(url):
    client = _client(url, "key-a")
    resp = client.responses.create(model=MODEL, input="Think first.", max_output_tokens=8,
                                   temperature=0)
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.usage.output_tokens_details.reasoning_tokens >= 1
    # The random demo model rarely closes its thought: then all 8 tokens are reasoning.
    assert resp.status == "completed" or resp.incomplete_details.reason == "max_output_tokens"
