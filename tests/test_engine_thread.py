"""The engine thread owns every mlx call: asyncio front ends with forks never abort at exit.

Before the engine had its own thread, `await session.arun(...)` / `session.astream(...)` with a
fork ran mlx on asyncio's executor threads and aborted at interpreter exit in about 1 of 12
runs ("terminate called without an active exception", status 134). The child below does what
a user's asyncio program does and exits without closing anything by hand; every run must
exit 0 with its output complete.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

CHILD = r"""
import asyncio, sys
import forkv

async def main():
    session = forkv.Session("demo:gemma3:tiny")  # closed by nobody: exit must still be clean
    user = session.system("You are terse.").user("Name three colours. " * 40)
    branches = user.fork(3, kind="final", gen={"max_tokens": 6})
    await session.arun(branches)
    more = user.fork(2, kind="final", gen={"max_tokens": 6})
    seen = 0
    async for event in session.astream(more):
        seen += event.is_last
    stream = session.engine.submit("hello " * 30, max_tokens=4)
    tokens = [t async for e in stream for t in e.token_ids]
    print("ok", seen, len(tokens), flush=True)

asyncio.run(main())
"""


def _run_child(_):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       timeout=300, env=env)
    return r.returncode, r.stdout, r.stderr[-2000:]


def _exits(n: int) -> list[tuple[int, str, str]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(_run_child, range(n)))


def _assert_clean(results):
    bad = [(rc, err) for rc, out, err in results if rc != 0 or out.strip() != "ok 2 4"]
    assert not bad, f"{len(bad)} of {len(results)} runs did not exit cleanly: {bad[:2]}"


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
def test_async_forks_exit_cleanly():
    _assert_clean(_exits(2))


@pytest.mark.slow
def test_async_forks_exit_cleanly_in_50_fresh_processes():
    _assert_clean(_exits(50))


def test_the_engine_thread_hands_freed_heap_back_once_out_of_work(monkeypatch):
    """After work, once there is none, the thread trims the heap (arenas.trim) — once, not on
    every idle wake-up, and not again until more work has run."""
    import threading
    import time

    from forkv import arenas
    from forkv.engine.request.worker import EngineThread

    trims = []
    monkeypatch.setattr(arenas, "IDLE_TRIM_S", 0.05)
    monkeypatch.setattr(arenas, "trim", lambda collect=True: trims.append(collect) or True)

    class Owner:  # the thread holds its has_work and step weakly
        def __init__(self):
            self.left = 3

        def has_work(self):
            return self.left > 0

        def step(self):
            self.left -= 1

    owner = Owner()
    thread = EngineThread("test-trim", owner.has_work, owner.step)
    try:
        deadline = time.monotonic() + 10
        while not trims and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.left == 0 and trims == [False]  # no gc pass on the engine thread
        time.sleep(0.3)  # idle: no more trims
        assert trims == [False]
        done = threading.Event()
        thread.post(done.set)
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while len(trims) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert trims == [False, False]
    finally:
        thread.close()
