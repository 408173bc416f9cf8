"""What a request body says: JSON under a size and depth limit, checked fields, sampling, images.

Bodies are parsed into pydantic models (unknown fields are ignored, as OpenAI clients send
many); a wrong field is a 400 naming it. Images arrive as `data:` URLs or bare base64 and are
decoded and opened here, so an unreadable one is a 400 before it reaches the engine. Remote
image URLs are refused: the server never fetches from the network. Knows nothing about routes.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from typing import Any, Literal

from forkv.engine import SamplingParams
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request

from .errors import APIError

__all__ = ["Sampling", "decode_image", "parse_body", "read_json", "sampling_params"]

DEFAULT_MAX_TOKENS = 512
MAX_DEPTH = 64  # arrays and objects inside each other; real requests nest a handful deep
_SEED_RANGE = 1 << 64  # the engine's random key is an unsigned 64-bit seed


async def read_json(request: Request, max_bytes: int) -> dict:
    """The body as a JSON object; 413 past `max_bytes`, 400 if it is not a JSON object."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"The body is not valid JSON ({e}); send a JSON object.",
                       "invalid_json") from None
    except RecursionError:  # the parser's own limit, near 1,000 levels
        raise _too_deep(_deep_field(raw.decode("utf-8", "replace"))) from None
    if not isinstance(body, dict):
        raise APIError(400, "The body must be a JSON object.", "invalid_json")
    where = _deeper_than(body, MAX_DEPTH)
    if where is not None:
        raise _too_deep(where)
    _check_text(body)
    return body


def _check_text(body: dict) -> None:
    """400 for a string holding a lone UTF-16 surrogate (JSON lets "\\ud800" through; no
    tokenizer can encode it), naming the top-level field it is in."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    field = None
    for k, v in body.items():
        try:
            json.dumps({k: v}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            field = k
            break
    raise APIError(400, f"{field or 'The body'} holds a lone UTF-16 surrogate (an escape such "
                        "as \\ud800 without its pair), which is not text; send valid "
                        "Unicode.", "invalid_value", field)


def _too_deep(where: str | None) -> APIError:
    return APIError(400, f"{where or 'The body'} nests arrays and objects more than {MAX_DEPTH} "
                         "levels deep; send a flatter body.", "invalid_value", where)


def _deeper_than(body: dict, limit: int) -> str | None:
    """The top-level field of `body` in which arrays and objects nest more than `limit` deep
    (the body itself is level 1), or None; without recursion."""
    stack = [(v, 2, k) for k, v in body.items() if isinstance(v, (dict, list))]
    while stack:
        value, depth, field = stack.pop()
        if depth > limit:
            return field
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1, field) for v in items if isinstance(v, (dict, list)))
    return None


_SPACE = re.compile(r"\s*")


def _deep_field(text: str) -> str | None:
    """The top-level field of the JSON object `text` whose value is too deep for the parser,
    found by decoding field by field; None when `text` is not such an object."""
    decoder, i = json.JSONDecoder(), _SPACE.match(text).end()
    if not text.startswith("{", i):
        return None
    i += 1
    while True:
        i = _SPACE.match(text, i).end()
        if not text.startswith('"', i):
            return None
        try:
            key, i = decoder.raw_decode(text, i)
            i = _SPACE.match(text, i).end()
            if not text.startswith(":", i):
                return None
            _, i = decoder.raw_decode(text, _SPACE.match(text, i + 1).end())
        except RecursionError:
            return key
        except ValueError:
            return None
        i = _SPACE.match(text, i).end()
        if not text.startswith(",", i):
            return None
        i += 1


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"The body is larger than this server's limit of {max_bytes} bytes; "
                         "send less (or start the server with a larger --max-body).",
                    "request_too_large")


def parse_body(model: type[BaseModel], body: dict) -> Any:
    """`body` as `model`, or a 400 that names the first wrong field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        code = "missing_required_parameter" if err["type"] == "missing" else "invalid_value"
        raise APIError(400, f"{where or 'body'}: {err['msg']}.", code, where) from None


class Sampling(BaseModel):
    """The sampling fields the chat and responses bodies share (both APIs' names)."""

    model_config = {"extra": "ignore"}

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 63)  # OpenAI's: any 64-bit integer
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None  # chat's field; /v1/responses takes it too
    # forkv's: draft and verify tokens (the same tokens either way); None: the server's setting
    speculate: Literal["auto", "on", "off"] | None = None


def sampling_params(req: Sampling, max_tokens: int | None, top_logprobs: int = 0) -> SamplingParams:
    """The engine's SamplingParams for a request; 400 on values out of range."""
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0 <= temperature <= 2:
        raise APIError(400, f"temperature must be between 0 and 2, got {temperature}.",
                       "invalid_value", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 < top_p <= 1:
        raise APIError(400, f"top_p must be in (0, 1], got {top_p}.", "invalid_value", "top_p")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}.",
                       "invalid_value", "max_tokens")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop takes up to 4 non-empty strings.", "invalid_value", "stop")
    if req.top_k is not None and req.top_k < 0:
        raise APIError(400, "top_k must be >= 0 (0 = off).", "invalid_value", "top_k")
    return SamplingParams(max_tokens=max_tokens or DEFAULT_MAX_TOKENS, temperature=temperature,
                          top_p=top_p, top_k=req.top_k or 0, stop=tuple(stop),
                          seed=None if req.seed is None else req.seed % _SEED_RANGE,
                          top_logprobs=top_logprobs, logit_bias=_logit_bias(req.logit_bias))


def _logit_bias(bias: dict | None) -> dict[int, float]:
    """OpenAI's `logit_bias` (token id as a string -> bias in [-100, 100]) as the engine's.
    A token id past the vocabulary is refused by the engine at submit (also a 400)."""
    out = {}
    for key, value in (bias or {}).items():
        if not str(key).isdigit() or not -100 <= value <= 100:
            raise APIError(400, f"logit_bias[{key!r}]: keys are token ids and values are "
                                f"between -100 and 100, got {value!r}.", "invalid_value",
                           "logit_bias")
        out[int(key)] = float(value)
    return out


def decode_image(url: object, param: str) -> bytes:
    """Bytes of an image given as a `data:` URL or bare base64, checked to open as an image."""
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{param} needs an image URL.", "invalid_image", param)
    if url.startswith(("http://", "https://")):
        raise APIError(400, f"{param}: this server does not fetch remote images; send the image "
                            "inline as a data: URL (data:image/png;base64,...).",
                       "invalid_image_url", param)
    if url.startswith("data:"):
        header, _, url = url.partition(",")
        if not header.endswith(";base64"):
            raise APIError(400, f"{param}: a data: URL must be base64 encoded.",
                           "invalid_image", param)
    try:
        data = base64.b64decode(url, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{param}: the image is not valid base64.", "invalid_image",
                       param) from None
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            im.verify()
    except ImportError:
        pass  # no Pillow: the engine's own loader will judge the bytes
    except Exception:  # noqa: BLE001 - any decoder failure means the same to the client
        raise APIError(400, f"{param}: the image cannot be read; send a PNG, JPEG, GIF, BMP "
                            "or WebP image.", "invalid_image", param) from None
    return data
