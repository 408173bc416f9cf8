"""A real `forkv serve` process on loopback for the server tests (random free port).

`running_server(args)` starts it with the same Python, waits for GET /health and yields its
base URL; the process is stopped (SIGINT, then kill) on exit and its stderr is shown if it
failed to come up; pass `log=` a binary file to keep its output (stdout and stderr) there.
`shared_server(args)` gives every test module that asks for the same arguments one server for
the whole session (starting one costs seconds), stopped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from forkv.bench.serve_procs import default_sigint  # (also the other tests' preexec_fn)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, timeout: float = 180.0, log=None):
    port = free_port()
    own_log = log is None
    log = tempfile.TemporaryFile() if own_log else log
    cmd = [sys.executable, "-m", "forkv.cli", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
                            preexec_fn=default_sigint)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"forkv serve did not come up:\n{log.read().decode()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        yield url
    finally:
        stop(proc)
        if own_log:
            log.close()


_shared: dict[tuple[str, ...], str] = {}


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C a server process, and kill it if it has not left within 20 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shared_server(*args: str) -> str:
    """The URL of the session's server started with `args` (started on first use)."""
    if args not in _shared:
        cm = running_server(*args)
        _shared[args] = cm.__enter__()
        atexit.register(cm.__exit__, None, None, None)
    return _shared[args]


# The tiny dense demo model, as most server tests use it.
TINY = ("--model", "demo:qwen3:tiny", "--reasoning", "off", "--max-body", "200000")


def http(method: str, url: str, body: bytes | dict | None = None,
         headers: dict | None = None) -> tuple[int, dict | str]:
    """One raw request; (status, JSON body or text)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def metric(url: str, name: str, labels: str = "", key: str | None = None) -> float:
    """The value of one sample of GET /metrics (0 if absent); `key`: the server's API key."""
    _, text = http("GET", f"{url}/metrics",
                   headers={"Authorization": f"Bearer {key}"} if key else None)
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


_EOS: dict[str, list[int]] = {}


def no_eos(model: str) -> dict[str, float]:
    """A `logit_bias` that bans `model`'s end-of-sequence tokens: a stream that must still be
    running when the test acts (a random model may otherwise end it at any token)."""
    if model not in _EOS:
        import forkv

        engine = forkv.load(model)
        try:
            _EOS[model] = sorted(engine.lm.eos_token_ids)
        finally:
            engine.close()
    return {str(t): -100 for t in _EOS[model]}
