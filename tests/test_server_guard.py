"""The server trusts no other web page (guard.py), checked without a browser against real
`forkv serve` processes (demo:qwen3:tiny): a DNS-rebinding Host and another site's simple
(no-preflight) POST are refused before any work, an --allow-origin page is served with CORS
headers and preflights, bodies must be JSON, --api-key guards every route but /health and the
web app's files, and the security headers are on JSON, SSE, HTML, error and 500 answers."""

from __future__ import annotations

import http.client as httpclient
import json

import pytest

openai = pytest.importorskip("openai")

from server_proc import TINY, metric, running_server, shared_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
MINE = "http://localhost:5173"  # the user's own web app, on another port
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SECURE = {"cache-control": "no-store", "x-content-type-options": "nosniff",
          "referrer-policy": "no-referrer", "x-frame-options": "DENY"}


@pytest.fixture(scope="module")
def url():
    return shared_server(*TINY)  # no API key: a foreign page is stopped by the guard alone


@pytest.fixture(scope="module")
def keyed():
    with running_server(*TINY, "--api-key", "k1", "--allow-origin", MINE + "/") as u:
        yield u


def call(url: str, method: str, path: str, body: object = None, headers: dict | None = None):
    """(status, lowercased headers, JSON body or text) of one raw request."""
    conn = httpclient.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    data = json.dumps(body) if isinstance(body, dict) else body
    conn.request(method, path, data, headers or {})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload


def port(url: str) -> str:
    return url.rsplit(":", 1)[1]


def assert_secure(headers: dict) -> None:
    for name, value in SECURE.items():
        assert headers.get(name) == value, (name, headers)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example:{port}", "", "[::1"])
def test_a_rebinding_host_is_refused(url, host):
    generated = metric(url, "forkv_tokens_generated_total")
    for method, path, body in [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", BODY)]:
        status, headers, payload = call(url, method, path, body, {
            "Host": host.format(port=port(url)), "Content-Type": "application/json"})
        assert status == 403 and payload["error"]["code"] == "host_not_allowed", payload
        assert "127.0.0.1" in payload["error"]["message"]
        assert_secure(headers)
    assert metric(url, "forkv_tokens_generated_total") == generated  # nothing ran


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST",
                                  "[::1]:{port}", "127.0.0.1"])
def test_loopback_names_are_served(url, host):
    status, _, payload = call(url, "GET", "/v1/models", None,
                              {"Host": host.format(port=port(url))})
    assert status == 200 and payload["data"], payload


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:5173",
                                    "http://127.0.0.1:1"])
def test_another_sites_simple_post_is_refused(url, origin):
    # text/plain and no custom header: a page may send this without a CORS preflight
    generated = metric(url, "forkv_tokens_generated_total")
    status, headers, payload = call(url, "POST", "/v1/chat/completions", json.dumps(BODY),
                                    {"Origin": origin, "Content-Type": "text/plain"})
    assert status == 403 and payload["error"]["code"] == "origin_not_allowed", payload
    assert f"--allow-origin {origin}" in payload["error"]["message"]
    assert "access-control-allow-origin" not in headers
    assert_secure(headers)
    status, headers, _ = call(url, "GET", "/v1/models", None, {"Origin": origin})
    assert status == 403 and "access-control-allow-origin" not in headers
    assert metric(url, "forkv_tokens_generated_total") == generated


def test_the_servers_own_page_may_call(url):
    own = f"http://127.0.0.1:{port(url)}"
    status, headers, payload = call(url, "POST", "/v1/chat/completions", BODY,
                                    {"Origin": own, "Content-Type": "application/json"})
    assert status == 200 and payload["choices"], payload
    assert "access-control-allow-origin" not in headers  # same origin: no CORS needed


def test_a_body_must_be_json(url):
    for kind in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                 "application/jsonx"):
        status, headers, payload = call(url, "POST", "/v1/chat/completions", json.dumps(BODY),
                                        {"Content-Type": kind} if kind else {})
        assert status == 415 and payload["error"]["code"] == "unsupported_media_type", kind
        assert "Content-Type: application/json" in payload["error"]["message"]
        assert_secure(headers)
    status, _, _ = call(url, "POST", "/v1/chat/completions", BODY,
                        {"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200


def test_an_allowed_origin_gets_cors_headers_and_preflights(keyed):
    status, headers, _ = call(keyed, "OPTIONS", "/v1/chat/completions", None, {
        "Origin": MINE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert status == 204  # a preflight carries no key: the browser sends it on its own
    assert headers["access-control-allow-origin"] == MINE and "Origin" in headers["vary"]
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    status, headers, payload = call(keyed, "POST", "/v1/chat/completions", BODY, {
        "Origin": MINE, "Content-Type": "application/json", "Authorization": "Bearer k1"})
    assert status == 200 and payload["choices"]
    assert headers["access-control-allow-origin"] == MINE
    assert_secure(headers)
    status, headers, payload = call(keyed, "OPTIONS", "/v1/chat/completions", None, {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert status == 403 and payload["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in headers


def test_the_api_key_guards_every_route_but_health_and_the_page(keyed):
    for method, path, body in [("GET", "/metrics", None), ("GET", "/v1/models", None),
                               ("GET", f"/v1/models/{MODEL}", None),
                               ("GET", "/v1/responses/resp_x", None),
                               ("DELETE", "/v1/responses/resp_x", None),
                               ("GET", "/v1/nothing-here", None),
                               ("POST", "/v1/chat/completions", BODY),
                               ("POST", "/v1/completions", json.dumps(BODY))]:
        status, headers, payload = call(keyed, method, path, body,
                                        {"Content-Type": "application/json"})
        assert status == 401 and payload["error"]["code"] == "invalid_api_key", (path, payload)
        assert_secure(headers)
    assert call(keyed, "GET", "/health")[0] == 200
    status, headers, page = call(keyed, "GET", "/")
    assert status in (200, 404)  # the web app's page (404 only in a build without it)
    if status == 200:
        assert headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert_secure(headers)
    status, _, text = call(keyed, "GET", "/metrics", None, {"Authorization": "Bearer k1"})
    assert status == 200 and "forkv_requests_total" in text


def test_headers_on_a_stream_and_an_error(url):
    status, headers, text = call(url, "POST", "/v1/chat/completions", {**BODY, "stream": True},
                                 {"Content-Type": "application/json"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert text.rstrip().endswith("data: [DONE]")
    assert_secure(headers)  # no-store replaces the stream's no-cache
    status, headers, payload = call(url, "POST", "/v1/chat/completions", {"model": MODEL},
                                    {"Content-Type": "application/json"})
    assert status == 400 and payload["error"]["param"] == "messages"
    assert_secure(headers)
    status, headers, _ = call(url, "GET", "/v1/nothing-here")
    assert status == 404
    assert_secure(headers)


def test_the_official_client_passes(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    out = client.chat.completions.create(model=MODEL, messages=BODY["messages"], max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert client.responses.create(model=MODEL, input="hi", max_output_tokens=2).id


def test_a_500_carries_the_headers_too():
    from forkv.server.app import ServerConfig, ServerState, make_app
    from starlette.responses import HTMLResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    def boom(request):
        raise RuntimeError("a bug")

    app = make_app(ServerState(ServerConfig(allow_origins=(MINE,))))
    app.router.routes += [Route("/boom", boom), Route("/page", lambda r: HTMLResponse("<p>"))]
    with TestClient(app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as c:
        r = c.get("/boom", headers={"Origin": MINE})
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        assert r.headers["access-control-allow-origin"] == MINE  # the page can read why
        assert_secure(r.headers)
        r = c.get("/page")
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert_secure(r.headers)
        r = c.get("/page", headers={"Host": "testserver"})  # TestClient's default name
        assert r.status_code == 403


def test_allow_origin_must_be_an_origin():
    from forkv.server.guard import OriginRefused, normalize_origin

    assert normalize_origin("HTTP://LocalHost:5173/") == "http://localhost:5173"
    assert normalize_origin("http://[::1]:3000") == "http://[::1]:3000"
    for bad in ("localhost:5173", "http://localhost:5173/app", "*", "ftp://x", ""):
        with pytest.raises(OriginRefused, match="--allow-origin"):
            normalize_origin(bad)


def test_serve_refuses_a_bad_allow_origin_before_loading():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "forkv.cli", "serve", "--model", MODEL,
                          "--allow-origin", "localhost:5173", "--port", "1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "--allow-origin takes an origin" in out.stderr, out.stderr
    assert "loading" not in out.stderr
