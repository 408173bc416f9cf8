"""POST /v1/completions: OpenAI's legacy text completions, prompts in, text out, JSON or SSE.

Knows the completions wire format: `prompt` as plain text (after the tokenizer's BOS, as
mlx-lm does), token ids, or a list of either (len(prompts) * n choices, index = prompt_index *
n + choice), `max_tokens` (16 by default, as OpenAI's), chat's sampling fields plus
`presence_penalty` / `frequency_penalty`, `logprobs` (0..5 alternatives per token, with
`text_offset`), `echo`, `stream` with `stream_options.include_usage`, and `usage` with
`prompt_tokens_details.cached_tokens`. `best_of` (other than n), `suffix`, and `echo` with
`logprobs` are refused: the engine samples each choice once and scores no prompt tokens. The
engine work is in `generation`, as for chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import replace
from typing import Any

from forkv.engine.request.sampling import vocab_limit
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from .auth import namespace_of
from .errors import APIError
from .generation import (
    collect,
    interleaved,
    prediction_details,
    start,
    stream_error,
    watch_disconnect,
)
from .inputs import Sampling, parse_body, read_json, sampling_params
from .sse import sse_response

__all__ = ["completions"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint (chat's is the model's room)


class CompletionRequest(Sampling):
    model: str
    prompt: Any  # checked by _prompts: its four shapes do not fit a pydantic union cleanly
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    n: int = Field(1, ge=1, le=16)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    cache_salt: str | None = None
    user: str | None = None


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _prompts(value: object, vocab: int | None) -> list[tuple[str, str | list[int]]]:
    """(param name, prompt) of each prompt in `prompt`: text or token ids; 400 naming a bad one."""
    if isinstance(value, str) or _is_ids(value):
        items = [("prompt", value)]
    elif isinstance(value, list) and value:
        items = [(f"prompt[{i}]", p) for i, p in enumerate(value)]
    else:
        raise APIError(400, "prompt must be a string, a list of token ids, or a list of "
                            "strings or of token-id lists.", "invalid_value", "prompt")
    for where, prompt in items:
        if not isinstance(prompt, str) and not _is_ids(prompt):
            raise APIError(400, f"{where} must be a string or a list of token ids.",
                           "invalid_value", where)
        if not prompt:
            raise APIError(400, f"{where} is empty; give at least one token of text.",
                           "invalid_value", where)
        if isinstance(prompt, list) and vocab is not None:
            for j, t in enumerate(prompt):
                if not 0 <= t < vocab:
                    raise APIError(400, f"{where}[{j}] is token id {t}, outside the model's "
                                        f"vocabulary of {vocab} ids (0..{vocab - 1}).",
                                   "invalid_value", f"{where}[{j}]")
    return items


def _refuse_unsupported(req: CompletionRequest) -> None:
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, f"best_of ({req.best_of}) is not supported: each choice is sampled "
                            "once; leave best_of out (or equal to n).", "unsupported_value",
                       "best_of")
    if req.suffix:
        raise APIError(400, "suffix (insertion) is not supported; put all the text in prompt.",
                       "unsupported_value", "suffix")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs would need the prompt tokens' logprobs, which "
                            "this server does not compute; drop echo or logprobs.",
                       "unsupported_value", "echo")


def _logprobs(tok, ids: list[int], lps: list[float], tops: list[dict], offset: int) -> dict:
    """The legacy logprobs object of `ids`; `text_offset` counts from `offset` (characters)."""
    tokens, offsets = [], []
    for tid in ids:
        text = tok.decode([tid])
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    top = []
    for k in range(len(ids)):
        alternatives: dict[str, float] = {}
        for t, v in (tops[k] if k < len(tops) else {}).items():
            text = tok.decode([t])  # two ids of one text (byte pieces): keep the likelier
            alternatives[text] = max(float(v), alternatives.get(text, float("-inf")))
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [float(x) for x in lps], "top_logprobs": top,
            "text_offset": offsets}


async def completions(request: Request) -> Any:
    state = request.app.state.forkv
    tenant = state.tenants.tenant(request.headers.get("authorization"))
    body = await read_json(request, state.config.max_body)
    req = parse_body(CompletionRequest, body)
    state = await state.model(req.model)  # the model it names (loaded on demand)
    _refuse_unsupported(req)
    namespace = namespace_of(tenant, req.cache_salt)
    prompts = _prompts(req.prompt, vocab_limit(state.lm))
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    params = replace(sampling_params(req, max_tokens, req.logprobs or 0),
                     presence_penalty=req.presence_penalty or 0.0,
                     frequency_penalty=req.frequency_penalty or 0.0)
    t0 = time.perf_counter()
    handles: list = []
    try:
        for where, prompt in prompts:
            handles += await _start(state, where, prompt, params, namespace, req.n,
                                    req.speculate)
    except BaseException:
        for h in handles:
            if not h.done:
                h.cancel()
        raise
    tok = state.lm.tokenizer
    echoes = [_echo(tok, p) if req.echo else "" for _, p in prompts for _ in range(req.n)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": req.model, "system_fingerprint": state.fingerprint}
    with_logprobs = req.logprobs is not None
    if req.stream:
        usage = bool((req.stream_options or {}).get("include_usage"))
        return sse_response(_stream(state, handles, head, usage, with_logprobs, tok, t0, echoes,
                                    req.n))
    watcher = asyncio.create_task(watch_disconnect(request, handles))
    try:
        results = await asyncio.gather(*(collect(state, h, t0) for h in handles))
    finally:
        watcher.cancel()
    choices = [{"index": i, "text": echoes[i] + r.text,
                "logprobs": _logprobs(tok, r.token_ids, r.logprobs, r.top_logprobs,
                                      len(echoes[i])) if with_logprobs else None,
                "finish_reason": _finish(r.finish_reason)}
               for i, r in enumerate(results)]
    usage = _usage(handles, req.n, [r.timings for r in results],
                   sum(len(r.token_ids) for r in results))
    return JSONResponse({**head, "object": "text_completion", "choices": choices,
                         "usage": usage})


async def _start(state, where: str, prompt, params, namespace: str, n: int,
                 speculate: str | None) -> list:
    """`start()` for one prompt, its refusals naming that prompt (start speaks of messages)."""
    try:
        return await start(state, prompt, params, namespace, None, n, speculate=speculate)
    except APIError as e:
        if e.param != "messages":
            raise  # not about the prompt (a full queue, a huge max_tokens)
        raise APIError(e.status, e.message.replace("the messages", "the prompt"), e.code,
                       where) from None


def _echo(tok, prompt: str | list[int]) -> str:
    return prompt if isinstance(prompt, str) else tok.decode(prompt)


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _usage(handles, n: int, finals: list, completion: int) -> dict:
    """`finals`: each choice's last Timings (None while it runs)."""
    # Each prompt's n choices share it: count it once, cached as its first choice found it.
    firsts = range(0, len(handles), n)
    prompt = sum(len(handles[i].prompt_tokens) for i in firsts)
    cached = sum(finals[i].reused_tokens for i in firsts if i < len(finals) and finals[i])
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": prediction_details(finals)}


async def _stream(state, handles, head, include_usage: bool, logprobs: bool, tok, t0,
                  echoes: list[str], n: int):
    finals, generated = [None] * len(handles), [0] * len(handles)
    offsets = [len(e) for e in echoes]  # characters sent per choice, for text_offset

    def chunk(choices, usage=None):
        body = {**head, "object": "text_completion", "choices": choices}
        if include_usage:
            body["usage"] = usage
        return body

    async with contextlib.aclosing(interleaved(state, handles, t0)) as stream:
        if any(echoes):
            yield chunk([{"index": i, "text": e, "logprobs": None, "finish_reason": None}
                         for i, e in enumerate(echoes)])
        async for i, event, error in stream:
            if error is not None:
                yield stream_error(error)
                return
            generated[i] += len(event.token_ids)
            choice = {"index": i, "text": event.text, "logprobs": None, "finish_reason": None}
            if logprobs:
                choice["logprobs"] = lp = _logprobs(tok, event.token_ids, event.logprobs,
                                                    event.top_logprobs, offsets[i])
                offsets[i] += sum(len(t) for t in lp["tokens"])
            if event.finish_reason is not None:
                finals[i] = event.timings
                choice["finish_reason"] = _finish(event.finish_reason)
            if event.text or event.finish_reason is not None or event.token_ids and logprobs:
                yield chunk([choice])
        if include_usage:
            yield chunk([], _usage(handles, n, finals, sum(generated)))
