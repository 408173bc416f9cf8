"""The one thread that owns an engine's mlx work.

Every mlx call of an engine (loading, restoring, prefill, decode, recording) runs on its
`EngineThread`: other threads and asyncio tasks hand it work with `call` (wait for the result)
or `post` (fire and forget), and it steps the scheduler whenever there is work. mlx keeps
per-thread state, so running it on whatever thread happens to call (asyncio executors, server
workers) could abort the process at exit; one owner thread, stopped and joined before the
interpreter shuts down (`atexit`, after the stores' own cleanup is registered), cannot.
Knows nothing about requests or models: the engine gives it `has_work` and `step`, which it
holds weakly, so an engine nobody references is collected and its thread ends.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import forkv.security  # noqa: F401 - its atexit cleanup must be registered before ours
from forkv import arenas

from ..errors import EngineClosed

_log = logging.getLogger(__name__)
_live: weakref.WeakSet[EngineThread] = weakref.WeakSet()


class EngineThread:
    def __init__(self, name: str, has_work: Callable[[], bool], step: Callable[[], Any],
                 wait_s: Callable[[], float | None] | None = None):
        self._has_work = weakref.WeakMethod(has_work)
        self._step = weakref.WeakMethod(step)
        # seconds until work that is not due yet will be (None: none): the idle wait's timeout
        self._wait_s = weakref.WeakMethod(wait_s) if wait_s is not None else None
        self._cond = threading.Condition()
        self._calls: deque[tuple[Callable, Future | None]] = deque()
        self._closing = False
        self.paused = False  # no automatic steps (tests and drains step by hand)
        self._busy = False  # work ran since the last trim of freed heap
        self._trimmed_at = 0.0
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()
        _live.add(self)

    @property
    def is_current(self) -> bool:
        return threading.current_thread() is self.thread

    @property
    def has_calls(self) -> bool:
        """Whether calls (a new request, a cancel) wait for the thread: read without the lock,
        a hint for a step to make room, no more."""
        return bool(self._calls)

    @property
    def is_alive(self) -> bool:
        return self.thread.is_alive() and not self._closing

    def call(self, fn: Callable, *args: Any) -> Any:
        """Run `fn(*args)` on the engine thread and return its result (or raise its error)."""
        if self.is_current:
            return fn(*args)
        future: Future = Future()
        self._enqueue(fn, args, future)
        return future.result()

    def post(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the engine thread soon; errors are logged, not raised."""
        self._enqueue(fn, args, None)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close_soon(self) -> None:
        """Ask the thread to end after the calls already queued; returns at once."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop after the calls already queued; join unless called from the thread itself."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if not self.is_current:
            self.thread.join()

    def _enqueue(self, fn: Callable, args: tuple, future: Future | None) -> None:
        with self._cond:
            if self._closing:
                raise EngineClosed("This engine is closed; create a new one (forkv.load).")
            self._calls.append((lambda: fn(*args), future))
            self._cond.notify_all()

    def _timeout(self) -> float | None:
        wait_s = self._wait_s() if self._wait_s is not None else None
        return None if wait_s is None else wait_s()

    def _work(self) -> bool:
        has_work = self._has_work()
        return has_work is not None and not self.paused and has_work()

    def _loop(self) -> None:
        while True:
            with self._cond:
                trim = self._wait_for_work()
                calls = list(self._calls)
                self._calls.clear()
                if (self._closing or self._step() is None) and not calls:
                    _clear_streams()
                    return
            if trim:
                self._trim()
                continue
            self._run_all(calls)
            del calls  # no reference to the engine may outlive the iteration (weak owner)
            self._step_once()

    def _wait_for_work(self) -> bool:
        """Wait (holding the lock) until there is work; True instead when there is none and
        freed heap is due to be handed back (`_trim`)."""
        while not (self._calls or self._closing or self._work()):
            trim_in = (arenas.IDLE_TRIM_S - (time.monotonic() - self._trimmed_at)
                       if self._busy else None)
            if trim_in is not None and trim_in <= 0:
                return True
            timeout = self._timeout()
            self._cond.wait(trim_in if timeout is None or (trim_in is not None
                                                           and trim_in < timeout) else timeout)
        self._busy = True
        return False

    def _trim(self) -> None:
        """Out of work after some: hand the heap's freed pages back (at most every
        IDLE_TRIM_S seconds), so RSS falls back after a long prompt's buffers."""
        self._trimmed_at, self._busy = time.monotonic(), False
        mlx = sys.modules.get("mlx.core")
        if mlx is not None:  # mlx's cached buffers first (request/buffers.py), then malloc's
            mlx.clear_cache()
        arenas.trim(collect=False)

    def _step_once(self) -> None:
        step = self._step() if self._work() else None
        if step is not None:
            try:
                step()
            except Exception:  # noqa: BLE001 - the thread must outlive a failed step
                _log.exception("forkv engine step failed")

    @staticmethod
    def _run_all(calls: list) -> None:
        for fn, future in calls:
            _run(fn, future)


def _clear_streams() -> None:
    """Destroy the mlx streams this thread made, before it ends: a thread that ends with its
    streams alive aborts the process at exit ("terminate called without an active
    exception")."""
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.clear_streams()


def _run(fn: Callable, future: Future | None) -> None:
    if future is not None and not future.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        if future is None:
            _log.exception("forkv engine call failed")
        else:
            future.set_exception(e)
    else:
        if future is not None:
            future.set_result(result)


@atexit.register
def close_all() -> None:
    """Stop every engine thread before the interpreter finalizes (and the stores close), then
    drop the main thread's own mlx state (see `_clear_main_thread`). Also the CLI's interrupt
    path, before it leaves with `os._exit`."""
    for worker in list(_live):
        for _ in range(3):  # a Ctrl-C here interrupts one join, not the shutdown order:
            try:           # a thread left inside mlx at finalization aborts the process
                worker.close()
                break
            except KeyboardInterrupt:
                continue
            except Exception:  # noqa: BLE001 - best effort at exit
                break
    _clear_main_thread()


def _clear_main_thread() -> None:
    """Clear the mlx streams and compile cache of the main thread while Python still runs.

    mlx keeps one compile cache per thread, and a compiled function (mlx-lm's `@mx.compile`
    helpers) forgets its entries only in the cache of the thread that called it last. A
    program that runs the model on the main thread and then on the engine thread leaves the
    main thread's entries behind; they hold Python objects and are destroyed with the
    thread's other thread-locals after the interpreter is gone: a segfault at exit. Threads
    other than the main one run their thread-local destructors when they end, with Python
    alive, or never (daemon threads at exit), so only the main thread needs this."""
    mx = sys.modules.get("mlx.core")
    if mx is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        mx.synchronize()  # nothing of the main thread's still queued on the streams we drop
        mx.clear_streams()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
