"""How the `forkv` process ends on Ctrl-C: one line, status 130, never an abort or a traceback.

Three moments. While forkv imports (before the CLI's error policy exists, ~2 s under load) the
guard `_startup` installs as `import forkv`'s first line makes a Ctrl-C print `forkv:
interrupted` and leave at once with 130: nothing is open yet. While a command runs, `take_over`
gives SIGINT back to Python, so it is the KeyboardInterrupt the CLI catches (the command closes
its engine on the way out). When the command has returned, `finish` ends the process in a fixed
order: after an interrupt it joins every engine thread, closes every store, flushes, and leaves
with `os._exit`, so no mlx thread or C++ destructor runs while the interpreter shuts down;
after a normal run it only makes a late Ctrl-C leave at once instead of raising inside an exit
handler (which would skip the engine join). A KeyboardInterrupt raised inside a `__del__` (a
regex compiled while a tokenizer loads) would be printed as "Exception ignored" with a
traceback and lost, so `take_over`'s handler also notes the Ctrl-C, its unraisable hook keeps
that traceback off the terminal, and `check` raises it again before a command starts its
long-running loop.
Knows nothing about commands or models.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from ._startup import INTERRUPTED, is_cli
from ._startup import leave_now as _leave_now

__all__ = ["INTERRUPTED", "arrived", "check", "finish", "is_cli", "leave", "take_over"]
_LEAVE_S = 10.0  # the most `leave` waits for engine threads and stores to close
_pending = False  # a Ctrl-C arrived since take_over


def _leave_quietly(signum=None, frame=None) -> None:
    os._exit(INTERRUPTED)  # the CLI has already said "interrupted", or finished its output


def _interrupt(signum=None, frame=None) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def _unraisable(info) -> None:
    """A Ctrl-C that a `__del__` took is already noted for `check`: no traceback for it."""
    if isinstance(info.exc_value, KeyboardInterrupt) and _pending:
        return
    sys.__unraisablehook__(info)


def take_over() -> None:
    """The CLI's try block has begun: SIGINT raises KeyboardInterrupt again (and is noted)."""
    if signal.getsignal(signal.SIGINT) is _leave_now:
        signal.signal(signal.SIGINT, _interrupt)
        sys.unraisablehook = _unraisable


def arrived() -> bool:
    """Whether a Ctrl-C arrived since `take_over`: an exception on the way out after one may
    be its KeyboardInterrupt wrapped by a library (pydantic-core builds a model's validators in
    Rust and reports a KeyboardInterrupt raised there as a `SchemaError`)."""
    return _pending


def check() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that arrived and was swallowed on its way (in a
    `__del__`, or by a library's blanket except), before a command starts to serve."""
    if _pending:
        raise KeyboardInterrupt


def finish(code: int) -> int:
    """End the CLI process after its command returned `code` (only for the process entry)."""
    signal.signal(signal.SIGINT, _leave_quietly)  # no KeyboardInterrupt in exit handlers
    if code != INTERRUPTED:
        return code  # the ordinary exit: engine threads are joined by their atexit hook
    leave(code)


def leave(code: int) -> None:
    """End the CLI process now with `code`, in `finish`'s fixed order (engine threads, stores,
    streams, `os._exit`): for a command whose work is done and saved when a Ctrl-C ends its
    wait (`forkv run --ui` holding its page), so no thread or destructor runs while the
    interpreter shuts down."""
    signal.signal(signal.SIGINT, _leave_quietly)
    # bounded: a thread that will not stop (a step still running on a loaded machine) must
    # not keep a finished, interrupted command alive; the stores' files are private and
    # sealed either way
    closer = threading.Thread(target=_close_everything, name="forkv-leave", daemon=True)
    closer.start()
    closer.join(_LEAVE_S)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _close_everything() -> None:
    """Engine threads first (their steps may still use a store), then the stores; each only
    if it was imported, so an interrupt during start-up imports nothing more."""
    worker = sys.modules.get("forkv.engine.request.worker")
    if worker is not None:
        worker.close_all()
    lifecycle = sys.modules.get("forkv.security.lifecycle")
    if lifecycle is not None:
        lifecycle.close_all()
    logging.shutdown()
