"""`generation.start` when the client goes away while its submit is still on a worker thread:
the handle that lands afterwards is cancelled, so the engine does not generate for nobody."""

import asyncio
import threading
from types import SimpleNamespace

from forkv.engine import SamplingParams
from forkv.server import generation


class _Handle:
    def __init__(self):
        self.done, self.cancelled = False, False

    def cancel(self):
        self.cancelled = True


class _SlowBackend:
    """Submits block until `release` is set; every handle made is kept."""

    def __init__(self):
        self.entered, self.release, self.handles = threading.Event(), threading.Event(), []

    def submit(self, tokens, params, images, namespace, speculate=None, drafts=()):
        self.entered.set()
        self.release.wait(10)
        handle = _Handle()
        self.handles.append(handle)
        return handle


def test_a_submit_that_lands_after_a_disconnect_is_cancelled(monkeypatch):
    backend = _SlowBackend()
    state = SimpleNamespace(backend=backend)
    monkeypatch.setattr(generation, "_prepare", lambda *a: [1, 2, 3])

    async def main():
        task = asyncio.create_task(generation.start(state, "hi", SamplingParams(), "ns"))
        await asyncio.to_thread(backend.entered.wait, 10)
        task.cancel()  # the client went away mid-submit
        await asyncio.sleep(0)
        backend.release.set()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("start should have been cancelled")
        for _ in range(200):  # the submit lands on its thread, then its callback runs here
            if backend.handles and backend.handles[0].cancelled:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(backend.handles) == 1 and backend.handles[0].cancelled


def test_submits_that_finish_are_returned_uncancelled(monkeypatch):
    backend = _SlowBackend()
    backend.release.set()
    state = SimpleNamespace(backend=backend)
    monkeypatch.setattr(generation, "_prepare", lambda *a: [1, 2, 3])
    monkeypatch.setattr(generation.logs, "note_prompt", lambda handles: None)
    handles = asyncio.run(generation.start(state, "hi", SamplingParams(), "ns", n=2))
    assert handles == backend.handles and not any(h.cancelled for h in handles)
