"""The servers `forkv bench serve` compares, as processes, and how one request is timed.

`ServerProcess` starts a server on a free loopback port, waits for GET /health, reads its peak
RSS (VmHWM) and stops it. `start_forkv` runs `forkv serve`; `start_peer` runs mlx-lm's own
`mlx_lm.server` on the same model folder in a process that activates forkv's BLAS before mlx
is imported and casts the weights to the dtype forkv computes in, so both sides run the same
arithmetic (vLLM and llama-server are started by `cluster_vllm` and `llamacpp`). `timed_chat`
streams one chat completion with the `openai` client and returns its time to first token and
the prompt tokens the server computed and reused (llama-server's `timings` where it sends
them). Knows nothing about the benchmark's cases.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_PEER = """
import sys
from forkv.engine.models import blas
blas.activate()  # before mlx is imported: the same BLAS as forkv
import mlx.core as mx
import mlx_lm.server as server
_load = server.load
def load(*args, **kwargs):
    out = _load(*args, **kwargs)
    out[0].set_dtype(getattr(mx, {dtype!r}))  # forkv's compute dtype on this device
    return out
server.load = load
sys.argv = ["mlx_lm.server", "--model", {folder!r}, "--host", "127.0.0.1", "--port", {port!r},
            "--log-level", "WARNING"]
server.main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_sigint() -> None:
    """A child's `preexec_fn` (the bench's servers, the tests' processes): a process started
    in the background (`cmd &`, nohup, a CI script) has SIGINT ignored, which a child
    inherits, and Python then installs no KeyboardInterrupt handler: a server's Ctrl-C would
    go unheard, and `stop` would wait out its 20 s and kill it instead."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    def __init__(self, name: str, cmd: list[str], port: int, model: str,
                 env: dict[str, str] | None = None):
        self.name, self.port, self.model = name, port, model
        self.cleanup: list[str] = []  # files the server reads, removed when it stops
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}  # `env` wins
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=default_sigint)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"{self.name} did not start:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)

    def peak_rss_mib(self) -> float | None:
        """Peak resident set so far (Linux VmHWM), MiB, summed over the server's process and
        its descendants (vLLM runs its engine in child processes); None where unreadable."""
        pids, total = [self.proc.pid], 0
        children = _children()
        for pid in pids:
            pids += children.get(pid, [])
            total += _status(pid).get("VmHWM", 0)
        return round(total / 1024, 1) if total else None

    def huge_pages_mib(self) -> float | None:
        """The server process's memory on transparent huge pages now (Linux AnonHugePages),
        MiB; None where unreadable."""
        try:
            with open(f"/proc/{self.proc.pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("AnonHugePages:"):
                        return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        for path in self.cleanup:
            Path(path).unlink(missing_ok=True)


def _status(pid: int) -> dict[str, int]:
    """The numeric fields of /proc/PID/status (kB for sizes); empty if it is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.split() and value.split()[0].isdigit():
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, over every process now running."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            ppid = _status(int(d.name)).get("PPid")
            if ppid is not None:
                out.setdefault(ppid, []).append(int(d.name))
    return out


def start_forkv(model: str, reuse: str | None = None,
                kv_dtype: str | None = None) -> ServerProcess:
    port = _free_port()
    cmd = [sys.executable, "-m", "forkv.cli", "serve", "--model", model, "--port", str(port),
           "--reasoning", "off", *(["--reuse", reuse] if reuse else []),
           *(["--kv-dtype", kv_dtype] if kv_dtype else [])]
    return ServerProcess("forkv serve", cmd, port, model)


def start_peer(folder: str, dtype: str) -> ServerProcess:
    port = _free_port()
    code = _PEER.format(folder=folder, port=str(port), dtype=dtype)
    # mlx_lm.server serves the --model folder as "default_model".
    return ServerProcess("mlx_lm.server", [sys.executable, "-c", code], port, "default_model")


@dataclass(slots=True)
class Timed:
    ttft_s: float
    total_s: float
    text: str
    completion_tokens: int
    cached_tokens: int | None
    prompt_tokens: int | None = None
    computed_tokens: int | None = None  # prompt tokens the server says it ran the model on
    server_prompt_tps: float | None = None  # llama-server's own timings, where it sends them
    server_decode_tps: float | None = None

    @property
    def decode_tps(self) -> float | None:
        """Generated tokens per second after the first one, from the client's clock."""
        span = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 \
            else None


def timed_chat(client, model: str, messages: list[dict], max_tokens: int, *, n: int = 1,
               temperature: float = 0.0, extra: dict | None = None,
               token_clock: bool = False) -> Timed:
    """Stream one completion (greedy unless `temperature`; `n` choices; `extra` body fields
    such as cache_salt or logit_bias); time to its first token (or to its end if none).
    The first token is the first chunk with text, unless `token_clock`: then the request asks
    for logprobs, so that every token sends a chunk, and the first chunk carrying a token
    stops the clock (a first token that is part of a character, such as a random model's
    byte token, sends no text until the character completes: text would time the next one).
    Computed prompt tokens: llama-server's `timings.prompt_n` where it sends timings (one per
    choice, all alike), else prompt_tokens - cached_tokens."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=temperature,
        stream=True, stream_options={"include_usage": True},
        **({"n": n} if n > 1 else {}), **({"extra_body": extra} if extra else {}),
        **({"logprobs": True} if token_clock else {}))
    first, parts, usages, timings = None, [], [], []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        if getattr(chunk, "timings", None):  # llama-server's extra field on its last chunks
            timings.append(chunk.timings)
        for choice in chunk.choices:
            token = token_clock and choice.logprobs is not None and choice.logprobs.content
            if (choice.delta.content or choice.finish_reason or token) and first is None:
                first = time.perf_counter() - t0
            parts.append(choice.delta.content or "")
    total = time.perf_counter() - t0
    usage = usages[0] if usages else None
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None) if details else None
    prompt = usage.prompt_tokens if usage else None
    # llama-server sends one usage per choice; forkv and vLLM one for all of them.
    completion = sum(u.completion_tokens or 0 for u in usages)
    if timings:  # one per choice, each with the shared prompt's figures: count it once
        computed, cached = timings[0].get("prompt_n"), timings[0].get("cache_n", cached)
    else:
        computed = prompt - (cached or 0) if prompt is not None else None
    return Timed(first if first is not None else total, total, "".join(parts), completion,
                 cached, prompt, computed,
                 timings[0].get("prompt_per_second") if timings else None,
                 timings[0].get("predicted_per_second") if timings else None)
