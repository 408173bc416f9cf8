"""`RemoteBackend`: the engine surface the SDK uses, served by OpenAI-compatible servers.

`submit` returns the same kind of handle a local `Engine` does (`stream()`, `async for`,
`result()`, `cancel()`); `submit_path` takes a planned node of a tree and sends its path as
chat messages (see `wire`). Requests run as tasks of one asyncio loop on a private thread
with one `httpx.AsyncClient`, so fork siblings go out concurrently. Each request goes to the
replicas in the router's order: a transport error, a timeout, a 5xx/408/429 or a stream cut
short marks the replica down and the request starts over on the next one (a replica that
failed before is probed with GET /health before it gets a request again); text already
streamed is checked against the new stream, never repeated. Per-request statistics come from
the server's `usage` (`prompt_tokens_details.cached_tokens` = reused tokens). `block_keys`
are computed here (salted like the server's namespace) so trees record them as on a local
engine; `release` is a no-op: the servers evict their own caches. Knows nothing about trees
beyond reading one planned job's path.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import threading
import time
from typing import Any

import httpx
from forkv.engine.events import GenerationEvent, Timings
from forkv.engine.handle import RequestHandle
from forkv.engine.models.special_tokens import encode_text
from forkv.engine.request.sampling import SamplingParams
from forkv.errors import ForkvError
from forkv.graph import ReasoningFormat

from .model import load_remote_model
from .router import Router, health_url
from .wire import chat_body, completion_body, parse_line, path_messages, route_key

__all__ = ["NoReplicaLeft", "RemoteBackend", "RemoteError"]


class RemoteError(RuntimeError, ForkvError):
    """A remote server refused a request, or its answer could not be used."""


class NoReplicaLeft(RemoteError, ConnectionError):
    """Every replica failed for one request."""


class _ReplicaFailed(Exception):
    """This replica cannot answer now: try the next one."""


_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class RemoteBackend:
    """Remote OpenAI-compatible servers as a forkv engine (see the module docstring)."""

    def __init__(self, endpoints: str | list[str], model: str | None = None, *,
                 api_key: str | None = None, tokenizer: Any = None, routing: str = "affinity",
                 cache_salt: str | None = None, block_size: int = 256,
                 reasoning: ReasoningFormat | None = None, context_length: int | None = None,
                 timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 max_attempts: int | None = None, recheck_s: float = 30.0):
        urls = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self.router = Router(urls, routing, recheck_s)
        self.api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.router.check_health()
        self.model = model or self._discover_model()
        self.lm = load_remote_model(self.model, tokenizer, context_length=context_length)
        self.block_size = block_size
        self.reasoning = reasoning or ReasoningFormat()
        # One salt per tenant (API key) unless given: the servers' caches never mix tenants.
        self.cache_salt = cache_salt if cache_salt is not None else hashlib.sha256(
            f"forkv-tenant\0{api_key or ''}".encode()).hexdigest()[:16]
        self.max_attempts = max_attempts or len(self.router.replicas)
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._ids = itertools.count(1)
        self._totals = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                        "completion_tokens": 0, "failovers": 0, "failed": 0}
        self._live: set[RequestHandle] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="forkv-remote",
                                        daemon=True)
        self._thread.start()
        self._client = asyncio.run_coroutine_threadsafe(self._make_client(), self._loop).result()

    def __repr__(self) -> str:
        urls = [r.url for r in self.router.replicas]
        return f"RemoteBackend({urls}, model={self.model!r}, routing={self.router.routing!r})"

    async def _make_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout,
                                 limits=httpx.Limits(max_connections=256))

    def _discover_model(self) -> str:
        for replica in self.router.order(b""):
            try:
                r = httpx.get(replica.url + "/models", headers=self._headers, timeout=5.0)
                return r.json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                continue
        raise NoReplicaLeft("No replica answered GET /v1/models to name its model; pass model= "
                            "or check that the servers are running.")

    # -- requests -----------------------------------------------------------------------------
    def _salt(self, namespace: str | None) -> str:
        """The `cache_salt` of a request in `namespace` (the servers' namespaces per salt)."""
        return self.cache_salt if namespace is None else f"{self.cache_salt}/{namespace}"

    def submit(self, prompt, params: SamplingParams | None = None, images=None, *,
               namespace: str | None = None, progress=None, **sampling_kw) -> RequestHandle:
        """Send one request; its handle at once. `prompt`: chat messages (to
        /v1/chat/completions; `{"type": "image"}` parts take `images` in order), text or token
        ids (to /v1/completions). `namespace` salts it further (another tenant)."""
        params = params or SamplingParams(**sampling_kw)
        salt = self._salt(namespace)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            from .wire import _with_images

            messages = _with_images(prompt, list(images or []))
            key = route_key(messages, salt)
            body = chat_body(self.model, messages, params, salt)
            return self._start("/chat/completions", body, key, self._count(messages), params,
                               progress)
        if isinstance(prompt, str):
            key = hashlib.sha256(f"{salt}\0{prompt[:1024]}".encode()).digest()
            # The server adds the tokenizer's BOS to a text prompt, as the engine does.
            tokens = encode_text(self.lm.tokenizer, prompt)
        else:
            tokens = [int(t) for t in prompt]
            key = self._first_key(tokens, salt)
        body = completion_body(self.model, prompt if isinstance(prompt, str) else tokens, params,
                               salt)
        return self._start("/completions", body, key, tokens, params, progress)

    def submit_path(self, tree, job, *, namespace: str | None = None,
                    progress=None) -> RequestHandle:
        """Send a planned `job` of `tree` (its path as chat messages); its handle."""
        from forkv.runner import sampling_params

        salt = self._salt(namespace)
        messages, cont = path_messages(tree, job, self.reasoning)
        params = sampling_params(job.gen)
        body = chat_body(self.model, messages, params, salt, continue_final=cont)
        return self._start("/chat/completions", body, route_key(messages, salt),
                           list(job.prompt.token_ids), params, progress)

    def _count(self, messages: list[dict]) -> list[int]:
        try:
            text = self.lm.tokenizer.apply_chat_template(messages, tokenize=False,
                                                         add_generation_prompt=True)
            return list(self.lm.tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # noqa: BLE001 - only informative (handle.prompt_tokens)
            return []

    def _first_key(self, tokens: list[int], salt: str) -> bytes:
        head = ",".join(map(str, tokens[: self.block_size]))
        return hashlib.sha256(f"{salt}\0{head}".encode()).digest()

    def _start(self, path, body, key, tokens, params, progress) -> RequestHandle:
        holder: dict[str, Any] = {}

        def cancel(handle: RequestHandle) -> bool:
            task = holder.get("task")
            if handle.done or task is None:
                return False
            self._loop.call_soon_threadsafe(task.cancel)
            return True

        handle = RequestHandle(next(self._ids), tokens, params, cancel)
        with self._lock:
            self._live.add(handle)

        async def go():
            holder["task"] = asyncio.current_task()
            await self._run(handle, path, body, key, progress)

        asyncio.run_coroutine_threadsafe(go(), self._loop)
        return handle

    async def _run(self, handle, path, body, key, progress) -> None:
        t0 = time.perf_counter()
        state = {"text": "", "lps": 0, "first": None}
        tried: list[str] = []
        try:
            for replica in self.router.order(key)[: self.max_attempts]:
                try:
                    if replica.down_until and not await self._is_healthy(replica.url):
                        raise _ReplicaFailed("GET /health did not answer 200")
                    usage, finish = await self._attempt(handle, replica.url + path, body, state)
                except (httpx.TransportError, _ReplicaFailed) as e:
                    self.router.mark_down(replica)
                    tried.append(f"{replica.url} ({type(e).__name__}: {e})")
                    with self._lock:
                        self._totals["failovers"] += 1
                    continue
                self.router.mark_up(replica)
                self._finish(handle, usage, finish, state, t0, progress)
                return
            raise NoReplicaLeft(f"No replica could answer: {'; '.join(tried)}; start or fix a "
                                "server, or add endpoints.")
        except asyncio.CancelledError:
            handle.push(GenerationEvent("", [], [], "cancelled", Timings()))
        except Exception as e:  # noqa: BLE001 - handed to the reader of the handle
            with self._lock:
                self._totals["failed"] += 1
            handle.fail(e if isinstance(e, ForkvError) else RemoteError(
                f"The remote request failed ({type(e).__name__}: {e})."))
        finally:
            with self._lock:
                self._live.discard(handle)

    async def _is_healthy(self, url: str) -> bool:
        """Probe a replica that failed before, before trusting it with a request again."""
        try:
            r = await self._client.get(health_url(url), timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def _attempt(self, handle, url, body, state) -> tuple[dict, str]:
        """Stream one try; push only text not pushed by an earlier try (checked equal)."""
        seen, lps, usage, finish = "", [], None, None
        async with self._client.stream("POST", url, json=body, headers=self._headers) as r:
            if r.status_code != 200:
                detail = (await r.aread()).decode(errors="replace")[:300]
                if r.status_code in _RETRY_STATUS:
                    raise _ReplicaFailed(f"HTTP {r.status_code}")
                raise RemoteError(f"{url} refused the request (HTTP {r.status_code}: {detail}); "
                                  "fix the request or the server's model name.")
            async for line in r.aiter_lines():
                piece = parse_line(line)
                if piece is None:
                    continue
                if piece.error is not None:
                    raise _ReplicaFailed(piece.error)
                usage = piece.usage or usage
                finish = piece.finish_reason or finish
                seen += piece.text
                lps += piece.logprobs
                done = state["text"]
                if not (seen.startswith(done) or done.startswith(seen)):
                    raise RemoteError("After a failover the next replica generated different "
                                      "text; use temperature 0 or a seed for failover-safe "
                                      "requests.")
                new = seen[len(done):] if len(seen) > len(done) else ""
                new_lps = lps[state["lps"]:]
                if new or new_lps:
                    state["first"] = state["first"] or time.perf_counter()
                    state["text"] += new
                    state["lps"] += len(new_lps)
                    handle.push(GenerationEvent(new, [], new_lps))
        if finish is None:
            raise _ReplicaFailed("the stream ended before a finish_reason")
        return usage or {}, finish

    def _finish(self, handle, usage, finish, state, t0, progress) -> None:
        ids = list(self.lm.tokenizer.encode(state["text"], add_special_tokens=False)) \
            if state["text"] else []
        prompt = int(usage.get("prompt_tokens") or len(handle.prompt_tokens))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        generated = int(usage.get("completion_tokens") or len(ids))
        now, first = time.perf_counter(), state["first"] or time.perf_counter()
        timings = Timings(prompt_tokens=prompt, reused_tokens=cached,
                          computed_tokens=max(0, prompt - cached), generated_tokens=generated,
                          first_token_s=first - t0, decode_s=now - first)
        with self._lock:
            for name, n in (("requests", 1), ("prompt_tokens", prompt), ("cached_tokens", cached),
                            ("completion_tokens", generated)):
                self._totals[name] += n
        if progress is not None:
            progress(prompt - cached, prompt, cached)
        reason = "length" if finish == "length" else "stop"
        handle.push(GenerationEvent("", ids, [], reason, timings))

    # -- the rest of the engine surface -------------------------------------------------------
    def stream(self, prompt, params: SamplingParams | None = None, images=None, **kw):
        return self.submit(prompt, params, images, **kw).stream()

    def generate(self, prompt, params: SamplingParams | None = None, images=None, **kw):
        return self.submit(prompt, params, images, **kw).result()

    def block_keys(self, tokens, namespace: str | None = None) -> list[bytes]:
        """Chained keys of the full blocks of `tokens`, salted with the model and tenant."""
        key = hashlib.sha256(self.lm.fingerprint + self._salt(namespace).encode()).digest()
        out = []
        for i in range(len(tokens) // self.block_size):
            block = tokens[i * self.block_size:(i + 1) * self.block_size]
            key = hashlib.sha256(key + b",".join(str(int(t)).encode() for t in block)).digest()
            out.append(key)
        return out

    def turn_keys(self, tokens, namespace: str | None = None,
                  block_keys=None) -> dict[int, bytes]:
        """None here: the server places its own checkpoints (block keys are bookkeeping)."""
        return {}

    def release(self, keys) -> int:
        """Nothing to drop here (0): OpenAI-compatible servers evict their prefix caches
        themselves."""
        return 0

    def stats(self) -> dict:
        """Totals over every request: tokens reused (cached) and computed, failovers, and per
        replica requests, failures and health."""
        now = time.monotonic()
        with self._lock:
            t = dict(self._totals)
            running = len(self._live)
        t["tokens_reused"] = t["cached_tokens"]
        t["tokens_computed"] = t["prompt_tokens"] - t["cached_tokens"]
        t["queue"] = {"waiting": 0, "prefilling": 0, "running": running}
        t["replicas"] = {r.url: {"requests": r.requests, "failures": r.failures,
                                 "up": r.is_up(now)} for r in self.router.replicas}
        t["routing"] = self.router.routing
        return t

    def close(self) -> None:
        """Cancel what is running and close the HTTP client; idempotent."""
        if not self._loop.is_running():
            return

        async def shut():
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await self._client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> RemoteBackend:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
