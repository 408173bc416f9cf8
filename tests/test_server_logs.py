"""forkv serve's log (server/logs.py) from a real server: a line when a model starts loading and
when it is ready, one access line per request whose token counts are the response's usage
(streams included, logged when they end), no uvicorn access lines, and none of it with
--quiet."""

from __future__ import annotations

import re
import time

import pytest

openai = pytest.importorskip("openai")

from server_proc import running_server  # noqa: E402

MODEL = "demo:qwen3:tiny"
MESSAGES = [{"role": "user", "content": "Say something about foxes."}]
ACCESS = re.compile(r"^\S+ \S+ (INFO|WARNING) +(POST|GET|DELETE) (\S+) model=(\S+) (\d{3})"
                    r"(?: prompt=(\d+) cached=(\d+) generated=(\d+) ttft=([\d.]+)s)?"
                    r" total=([\d.]+)s(?: error=(\S+))?$")


def _client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _access_lines(path, count: int, wait: float = 15.0) -> list[re.Match]:
    """The log's access lines, once there are `count` (the last may land just after its
    response)."""
    deadline = time.monotonic() + wait
    while True:
        found = [m for line in path.read_text().splitlines() if (m := ACCESS.match(line))]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _send(client) -> dict:
    """A chat, the same chat streamed, a completion and a 400: their usage by name."""
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6)
    stream_usage = None
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=9,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        stream_usage = chunk.usage or stream_usage
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10 ** 9)
    return {"chat": chat.usage, "stream": stream_usage, "text": text.usage}


def _counts(usage) -> tuple[int, int, int]:
    return (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
            usage.completion_tokens)


@pytest.mark.slow  # (3-4 s, a server process: out of the 5-minute fast suite)
def test_model_loads_and_one_access_line_per_request(tmp_path):
    path = tmp_path / "serve.log"
    with path.open("wb") as log, running_server("--reasoning", "off", log=log) as url:
        usage = _send(_client(url))  # no --model: the first request loads it
        found = _access_lines(path, 4)
        time.sleep(0.5)  # nothing more comes
        text = path.read_text()
    lines = text.splitlines()
    assert sum(f"INFO    loading {MODEL}" in line for line in lines) == 1, text
    ready = [re.search(rf"INFO    {re.escape(MODEL)} ready in (\d+\.\d) s$", line)
             for line in lines]
    ready = [m for m in ready if m]
    assert len(ready) == 1, text
    load_s = float(ready[0].group(1))
    first_access = next(i for i, line in enumerate(lines) if ACCESS.match(line))
    assert (next(i for i, line in enumerate(lines) if "loading" in line)
            < next(i for i, line in enumerate(lines) if " ready in " in line) < first_access)

    assert len(found) == 4 and len([x for x in lines if ACCESS.match(x)]) == 4, text
    assert "/health" not in text and "HTTP/1.1" not in text  # probes are debug; no uvicorn lines
    got = sorted((m[2], m[3], m[4], int(m[5]),
                  tuple(int(x) for x in m.group(6, 7, 8)) if m[6] else None, m[11])
                 for m in found)
    want = sorted([("POST", "/v1/chat/completions", MODEL, 200, _counts(usage["chat"]), None),
                   ("POST", "/v1/chat/completions", MODEL, 200, _counts(usage["stream"]), None),
                   ("POST", "/v1/completions", MODEL, 200, _counts(usage["text"]), None),
                   ("POST", "/v1/chat/completions", MODEL, 400, None,
                    "context_length_exceeded")])
    assert got == want, text
    assert usage["stream"].prompt_tokens_details.cached_tokens > 0  # the same chat again
    for m in found:
        assert m[1] == "INFO"  # a client's 400 is not the server's trouble
        if m[9]:
            assert float(m[9]) <= float(m[10]) + 1e-3
    # Time to first token counts from the request's arrival: the first one waited for the load.
    first = next(m for m in found if m[5] == "200")
    assert float(first[9]) >= load_s - 0.1, text


@pytest.mark.slow  # (a server of its own: ~4 s)
def test_quiet_prints_no_load_or_access_lines(tmp_path):
    path = tmp_path / "serve.log"
    with path.open("wb") as log, running_server("--quiet", "--reasoning", "off",
                                                log=log) as url:
        usage = _send(_client(url))
        time.sleep(1.0)
        text = path.read_text()
    assert usage["chat"].completion_tokens > 0
    assert "forkv serve:" in text  # (the log is this server's)
    assert not [line for line in text.splitlines() if ACCESS.match(line)], text
    assert "loading" not in text and " ready in " not in text, text


def test_a_failing_route_is_one_warning_naming_its_exception():
    import logging

    from starlette.applications import Starlette
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from forkv.server.errors import install_handlers
    from forkv.server.logs import AccessLog

    async def boom(request):
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/boom", boom)])
    install_handlers(app)
    app.add_middleware(AccessLog)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("forkv.server")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            assert client.get("/boom").status_code == 500
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert re.fullmatch(r"GET /boom model=- 500 total=[\d.]+s error=RuntimeError",
                        records[0].getMessage())
