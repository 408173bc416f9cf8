"""OpenAI-style errors: one exception type, its JSON body, and the handlers that send it.

Every failure a client can cause leaves the server as `{"error": {"message", "type", "param",
"code"}}` with a 4xx status; anything else becomes a 500 with a one-line message (the
traceback goes to the server log, never to the client). Knows nothing about models.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from forkv.engine import GenerationError
from forkv.errors import ForkvError

from .logs import note_error

__all__ = ["APIError", "error_body", "install_handlers"]

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "server_error"}


class APIError(ForkvError):
    """A request the server refuses: HTTP status, one-sentence message, OpenAI error code."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.code, self.param),
                            status_code=self.status)


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    note_error(exc.code or str(exc.status))
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"No route {request.url.path}; see GET /v1/models and the README.",
               405: f"{request.method} is not allowed on {request.url.path}."}.get(
                   exc.status_code, str(exc.detail))
    return JSONResponse(error_body(exc.status_code, message, code), status_code=exc.status_code)


async def _bad_generation_input(request: Request, exc: Exception) -> JSONResponse:
    # The engine's GenerationError is bad input by definition (prompt, sampling settings).
    return JSONResponse(error_body(400, str(exc), "invalid_request"), status_code=400)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response is sent, so the traceback reaches the log.
    return JSONResponse(
        error_body(500, f"The server failed on this request ({type(exc).__name__}); it keeps "
                        "serving - see its log for details.", "internal_error"),
        status_code=500)


def install_handlers(app) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(GenerationError, _bad_generation_input)
    app.add_exception_handler(Exception, _unexpected)
