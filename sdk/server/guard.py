"""What the server lets in from a browser: Host, Origin, CORS, content type, API key, headers.

A page on another site must neither read nor start anything here, even though the server sits
on the user's own machine. `Guard` (ASGI middleware) refuses, each with a JSON error that says
what to do:

- a `Host` that is not a loopback name (localhost, 127.0.0.1, [::1], any port) or the address
  the server was started with (`--host`): a DNS-rebinding page sends its own name. A server
  bound to every address (0.0.0.0, ::) takes any name; it cannot start without an API key;
- an `Origin` other than the server's own unless `--allow-origin` names it (a user's own web
  app on another port); CORS preflights are answered for those origins only;
- a POST, PUT or PATCH whose `Content-Type` is not `application/json` (a form or a
  `text/plain` fetch is what another page can send without a preflight);
- with `--api-key`, a request without a valid key on any route but `GET /health` and the web
  app's static files (`public`), so the page can load and then asks for the key.

`SecureHeaders` (outermost, so 500s get them too) sets `Cache-Control: no-store`, `nosniff`,
`Referrer-Policy: no-referrer` and `X-Frame-Options: DENY` on every response, a strict
Content-Security-Policy (`default-src 'self'`, no inline script or style) on HTML, and the CORS
headers for an allowed origin. Pure ASGI (no BaseHTTPMiddleware): streams pass untouched.
Knows nothing about routes' bodies.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from forkv.errors import ForkvError
from starlette.datastructures import Headers, MutableHeaders

from .auth import Tenants
from .errors import APIError
from .logs import note_error

__all__ = ["CSP", "OriginRefused", "Policy", "Guard", "SecureHeaders", "normalize_origin"]

# images may be data:/blob: URLs (a picture the user attaches, shown before it is sent)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer", "x-frame-options": "DENY"}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_ORIGIN = re.compile(r"(https?)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:\d{1,5})?")
_HEADER_NAMES = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")
_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"


class OriginRefused(ValueError, ForkvError):
    """An --allow-origin value that is not an origin."""


def normalize_origin(origin: str) -> str:
    """`origin` (scheme://host[:port], or "null") as browsers send it; OriginRefused if not."""
    text = origin.strip().rstrip("/").lower()
    if text == "null" or _ORIGIN.fullmatch(text):
        return text
    raise OriginRefused(f"--allow-origin takes an origin such as http://localhost:5173 (scheme, "
                        f"host and port, no path), got {origin!r}.")


def _host_name(host: str) -> str | None:
    """The name in a Host header ("[::1]:8000" -> "::1"), lowercased; None if malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        return name if sep and (not rest or re.fullmatch(r":\d{1,5}", rest)) else None
    name, _, port = host.partition(":")
    return name if name and (not port or port.isdigit()) else None


def _is_loopback(name: str) -> bool:
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Policy:
    """Who may call: the bind address, the extra origins, the keys, the public GET paths."""

    host: str = "127.0.0.1"
    allow_origins: frozenset[str] = frozenset()
    public_paths: frozenset[str] = frozenset({"/health"})
    public_prefixes: tuple[str, ...] = ()

    @classmethod
    def make(cls, host: str, allow_origins=(), **public) -> Policy:
        return cls(host.strip("[]").lower(), frozenset(normalize_origin(o) for o in allow_origins),
                   **public)

    def is_host_allowed(self, host: str | None) -> bool:
        if self.host in _WILDCARDS:
            return True
        name = _host_name(host or "")
        return name is not None and (_is_loopback(name) or name == self.host)

    def is_public(self, method: str, path: str) -> bool:
        return method in ("GET", "HEAD") and (
            path in self.public_paths or path.startswith(self.public_prefixes))

    def foreign_origin(self, scope, headers: Headers) -> str | None:
        """The request's Origin when it is another site's (None: none, or the server's own)."""
        origin = headers.get("origin")
        if origin is None:
            return None
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
        return None if origin.lower() == own else origin.lower()


class Guard:
    """ASGI middleware: refuse what `Policy` does not let in (see the module docstring)."""

    def __init__(self, app, policy: Policy, tenants: Tenants):
        self.app, self.policy, self.tenants = app, policy, tenants

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        try:
            preflight = self._check(scope, headers)
        except APIError as e:
            note_error(e.code or str(e.status))
            return await e.response()(scope, receive, send)
        if preflight is not None:
            return await preflight(scope, receive, send)
        await self.app(scope, receive, send)

    def _check(self, scope, headers: Headers):
        """None when the request may go on; the answer to a CORS preflight; APIError else."""
        policy, method, path = self.policy, scope["method"], scope["path"]
        host = headers.get("host")
        if not policy.is_host_allowed(host):
            raise APIError(403, f"Requests for the host {host!r} are refused (a web page can "
                                "reach this server under its own name by DNS rebinding); use "
                                "http://127.0.0.1 or http://localhost with this server's port, "
                                "or the address it was started with (--host).",
                           "host_not_allowed")
        origin = policy.foreign_origin(scope, headers)
        if origin is not None and origin not in policy.allow_origins:
            raise APIError(403, f"Requests from the web page at {origin} are refused: this "
                                "server answers its own pages only; to let that page call it, "
                                f"start the server with --allow-origin {origin}.",
                           "origin_not_allowed")
        if method == "OPTIONS" and "access-control-request-method" in headers:
            return _preflight(headers)
        if not self.tenants.is_open and not policy.is_public(method, path):
            self.tenants.tenant(headers.get("authorization"))  # a 401 APIError without a key
        if method in _BODY_METHODS:
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                raise APIError(415, f"{method} bodies must be JSON sent with 'Content-Type: "
                                    f"application/json' (got {kind or 'none'!r}); set that "
                                    "header (the openai client does).",
                               "unsupported_media_type")
        return None


def _preflight(headers: Headers):
    """The answer to an allowed origin's CORS preflight (`SecureHeaders` adds its origin)."""
    from starlette.responses import Response

    asked = headers.get("access-control-request-headers", "").strip()
    allow = {"access-control-allow-methods": _METHODS, "access-control-max-age": "600"}
    if asked and _HEADER_NAMES.fullmatch(asked):
        allow["access-control-allow-headers"] = asked  # an allowed origin may send any header
    return Response(status_code=204, headers=allow)


class SecureHeaders:
    """ASGI middleware, outermost: the security headers on every response (module docstring)."""

    def __init__(self, app, policy: Policy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = self.policy.foreign_origin(scope, Headers(scope=scope))
        if origin not in self.policy.allow_origins:
            origin = None

        async def sending(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    headers[name] = value
                if headers.get("content-type", "").startswith("text/html"):
                    headers["content-security-policy"] = CSP
                if origin is not None:
                    headers["access-control-allow-origin"] = origin
                    headers.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, sending)
