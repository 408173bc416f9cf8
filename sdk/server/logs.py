"""The server's log: model loads and one access line per request, on the `forkv.server` logger.

`setup(quiet)` (called by `forkv serve`, never at import) gives that logger one stderr handler:
INFO by default, WARNING with `--quiet`, DEBUG with `-vv`. Lines:

    2026-12-02 03:20:01 INFO    loading demo:qwen3:tiny
    2026-12-02 03:20:03 INFO    demo:qwen3:tiny ready in 2.1 s
    2026-12-02 03:20:04 INFO    POST /v1/chat/completions model=demo:qwen3:tiny 200
        prompt=21 cached=0 generated=8 ttft=0.052s total=0.118s   (one line)

`AccessLog` (ASGI middleware) times each request from its arrival to the last byte of its
response, so a stream is logged when it ends, and writes its line. The routes feed it through
hooks that need no request object (a context variable carries the request's record; outside
a request they do nothing): `note_model` when a request names its model, `note_prompt` when
its generation starts, `note_event` for each piece generated, `note_error` with the code of
an error answer (`error=context_length_exceeded`; a 5xx names its exception). The token
counts are the response's `usage`: a prompt counted once for its n choices, cached as its
first choice found it, generated tokens of every choice. A 5xx, a 429 (the server is full)
and a model that fails to load are warnings; GET /health and /metrics are debug (probes).
Knows nothing about endpoints' formats.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["AccessLog", "format_access", "load_failed", "loading", "note_error", "note_event",
           "note_model", "note_prompt", "ready", "setup"]

_log = logging.getLogger("forkv.server")
_QUIET_PATHS = ("/health", "/metrics")


def setup(quiet: bool = False) -> None:
    """Log `forkv.server` to stderr: INFO, or WARNING when `quiet` (a lower root level set by
    `-v`/`FORKV_LOG` still wins). Replaces the handler an earlier call added."""
    for h in [h for h in _log.handlers if getattr(h, "_forkv_server", False)]:
        _log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    handler._forkv_server = True
    _log.addHandler(handler)
    _log.propagate = False  # one line each, not again through the root's handler (-v)
    _log.setLevel(min(logging.WARNING if quiet else logging.INFO,
                      logging.getLogger().getEffectiveLevel()))


# -- model loads --------------------------------------------------------------------------------
def loading(name: str) -> float:
    """Log that `name` starts loading; the start time, for `ready` or `load_failed`."""
    _log.info("loading %s", name)
    return time.perf_counter()


def ready(name: str, t0: float) -> None:
    _log.info("%s ready in %.1f s", name, time.perf_counter() - t0)


def load_failed(name: str, t0: float, error: BaseException) -> None:
    _log.warning("%s failed to load after %.1f s: %s", name, time.perf_counter() - t0, error)


# -- requests -----------------------------------------------------------------------------------
@dataclass(slots=True)
class _Record:
    start: float
    status: int | None = None
    model: str | None = None
    is_generating: bool = False
    prompt: int = 0
    cached: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    first_token: float | None = None  # seconds after `start`
    error: str | None = None  # the error code a refusal sent
    firsts: set = field(default_factory=set)  # ids of each prompt's first handle
    is_sent: bool = False  # the response's last byte went out
    client_left: bool = False  # the client disconnected before that


_current: ContextVar[_Record | None] = ContextVar("forkv_server_request", default=None)


def note_model(name: str) -> None:
    """The model the current request names."""
    rec = _current.get()
    if rec is not None:
        rec.model = name


def note_prompt(handles) -> None:
    """The handles of one prompt's choices were submitted (the first one counts the prompt)."""
    rec = _current.get()
    if rec is not None and handles:
        rec.is_generating = True
        rec.prompt += len(handles[0].prompt_tokens)
        rec.firsts.add(id(handles[0]))


def note_error(code: str) -> None:
    """The current request is answered with an error (its OpenAI error code)."""
    rec = _current.get()
    if rec is not None:
        rec.error = code


def note_event(handle, event) -> None:
    """One generated piece of `handle`."""
    rec = _current.get()
    if rec is None:
        return
    rec.generated += len(event.token_ids)
    if rec.first_token is None and (event.token_ids or event.finish_reason):
        rec.first_token = time.perf_counter() - rec.start
    if event.finish_reason is not None and event.timings is not None:
        rec.drafted += event.timings.drafted_tokens
        rec.accepted += event.timings.accepted_tokens
    if event.finish_reason is not None and id(handle) in rec.firsts:
        rec.cached += event.timings.reused_tokens


def format_access(method: str, path: str, rec: _Record, total_s: float) -> str:
    """One access line: method, path, model, status, tokens, time to first token, total."""
    parts = [method, path, f"model={rec.model or '-'}", str(rec.status or "-")]
    if rec.is_generating:
        ttft = "-" if rec.first_token is None else f"{rec.first_token:.3f}s"
        parts += [f"prompt={rec.prompt}", f"cached={rec.cached}",
                  f"generated={rec.generated}", f"ttft={ttft}"]
        if rec.drafted:
            parts.append(f"drafted={rec.drafted} accepted={rec.accepted}")
    parts.append(f"total={total_s:.3f}s")
    if rec.error:
        parts.append(f"error={rec.error}")
    if rec.client_left:
        parts.append("(client left)")
    return " ".join(parts)


def _level(path: str, status: int | None) -> int:
    if status is None or status >= 500 or status == 429:
        return logging.WARNING
    if path in _QUIET_PATHS and status < 400:
        return logging.DEBUG
    return logging.INFO


class AccessLog:
    """ASGI middleware: one access line per HTTP request, once its response has ended."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rec = _Record(time.perf_counter())
        token = _current.set(rec)

        async def sending(message):
            if message["type"] == "http.response.start":
                rec.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                rec.is_sent = True
            await send(message)

        async def receiving():
            message = await receive()
            if message["type"] == "http.disconnect" and not rec.is_sent:
                rec.client_left = True
            return message

        try:
            await self.app(scope, receiving, sending)
        except BaseException as e:
            if rec.status is None:  # answered by Starlette's outermost error middleware
                rec.status, rec.error = 500, rec.error or type(e).__name__
            raise
        finally:
            _current.reset(token)
            level = _level(scope["path"], rec.status)
            if _log.isEnabledFor(level):
                _log.log(level, "%s", format_access(scope["method"], scope["path"], rec,
                                                    time.perf_counter() - rec.start))
