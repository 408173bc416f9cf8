"""The OpenAI wire format a remote backend speaks: request bodies in, stream pieces out.

A node path becomes chat messages (`forkv.graph.render` gives the done nodes' messages: a
reasoning node rides on its final's message as `reasoning_content`, so each server's own
template keeps or drops old reasoning as it does for its model); images become `data:` URLs.
A reasoning node is asked for with the close tag as a stop string; a final node after a
reasoning node continues an assistant message holding that reasoning
(`continue_final_message`, which vLLM and SGLang honour; servers that ignore it see the
reasoning as a finished turn). Token-id and text prompts go to /v1/completions. Every body
carries `cache_salt`. SSE chunks parse into `Piece`s. Knows nothing about routing or retries.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Piece", "chat_body", "completion_body", "data_url", "parse_line", "path_messages",
           "route_key"]


def data_url(image: bytes) -> str:
    """A `data:` URL for image bytes (the type read from the file's magic number)."""
    mime = "image/png"
    if image[:3] == b"\xff\xd8\xff":
        mime = "image/jpeg"
    elif image[:4] == b"GIF8":
        mime = "image/gif"
    elif image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        mime = "image/webp"
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def _with_images(messages: list[dict], images: list[bytes]) -> list[dict]:
    """Fill `{"type": "image"}` placeholders (in order) with image_url parts."""
    left = list(images)
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if isinstance(p, dict) and p.get("type") == "image":
                    src = p.get("image")
                    img = src if isinstance(src, (bytes, bytearray)) else left.pop(0)
                    parts.append({"type": "image_url", "image_url": {"url": data_url(img)}})
                else:
                    parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


def path_messages(tree, job, fmt) -> tuple[list[dict], bool]:
    """Chat messages for `job`'s prompt and whether they end in an assistant message to
    continue (a final node after its reasoning node)."""
    path = tree.path(job.node_id)
    done, target = path[:-1], path[-1]
    images = [part.load_bytes(n.id) for n in done for part in n.images]
    messages = _with_images([dict(m) for m in job.prompt.messages], images)
    if target.kind == "final" and done and done[-1].kind == "reasoning":
        thought = fmt.open + (done[-1].text or "") + fmt.close
        messages.append({"role": "assistant", "content": thought})
        return messages, True
    return messages, False


def route_key(messages: list[dict], salt: str) -> bytes:
    """The key of a conversation's first block: its messages up to the first user turn."""
    head = []
    for m in messages:
        head.append({"role": m.get("role"), "content": m.get("content")})
        if m.get("role") == "user":
            break
    text = json.dumps(head, sort_keys=True, default=str)
    return hashlib.sha256(f"{salt}\0{text}".encode()).digest()


def _sampling(params) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                            "top_p": params.top_p}
    if params.top_k:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(params, name):
            body[name] = getattr(params, name)
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
    if params.min_p:
        body["min_p"] = params.min_p
    return body


def chat_body(model: str, messages: list[dict], params, salt: str, *,
              continue_final: bool = False) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": True,
            "cache_salt": salt, **_sampling(params)}
    if continue_final:
        body.update(continue_final_message=True, add_generation_prompt=False)
    return body


def completion_body(model: str, prompt: str | list[int], params, salt: str) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "stream": True, "logprobs": 1,
            "stream_options": {"include_usage": True}, "cache_salt": salt, **_sampling(params)}


@dataclass(slots=True)
class Piece:
    """What one SSE chunk said: text (answer or reasoning), logprobs, finish, usage."""

    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    error: str | None = None


def parse_line(line: str) -> Piece | None:
    """One SSE line as a `Piece`; None for comments, blank lines and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    chunk = json.loads(data)
    if "error" in chunk:
        err = chunk["error"]
        return Piece(error=err.get("message", str(err)) if isinstance(err, dict) else str(err))
    piece = Piece(usage=chunk.get("usage"))
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if delta is None:  # /v1/completions
            piece.text += choice.get("text") or ""
        else:
            # Servers with a reasoning parser send thinking apart from the answer.
            for name in ("reasoning_content", "reasoning", "content"):
                piece.text += delta.get(name) or ""
        lp = choice.get("logprobs") or {}
        if isinstance(lp.get("content"), list):
            piece.logprobs += [float(t["logprob"]) for t in lp["content"]]
        elif isinstance(lp.get("token_logprobs"), list):
            piece.logprobs += [float(v) for v in lp["token_logprobs"] if v is not None]
        if choice.get("finish_reason"):
            piece.finish_reason = choice["finish_reason"]
    return piece
