"""Process lifecycle of stores: clean up at exit and on SIGTERM/SIGHUP, go inert after fork.

Knows: which stores are open in this process, and the three ways a process ends or splits
(normal exit, a terminating signal, ``fork``); ``ProcessHooks``, mixed into ``BlobStore``,
holds the store's side of it (lock-free folder removal, going inert after fork). Does not
know: how a store closes — it calls ``store.close()``. SIGKILL cannot be caught; the data file
is nameless and the key was only in memory, so nothing readable is left, and the start-up
sweep of a later store removes the empty folder.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any

__all__ = ["ProcessHooks", "close_all", "register", "unregister"]

_stores: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()
_signals_installed = False
_SIGNAL_GRACE_S = 5.0  # below the usual 10 s between SIGTERM and SIGKILL (docker stop)
_HANDLED = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None
)


class ProcessHooks:
    """Mixin for ``BlobStore``: what it does when its process is signalled or forks."""

    def _is_closable_now(self) -> bool:
        """Signal path, on the main thread: False if it was interrupted holding our locks."""
        locks = (self._lock, self._queue._cond)
        return not any(getattr(lock, "_is_owned", lambda: False)() for lock in locks)

    def _remove_folder_now(self) -> None:
        """Lock-free last resort (signal path): remove the private folder; the key dies with us."""
        folder = self._file.folder if self._file is not None else None
        if folder is not None and os.getpid() == self._pid:
            try:
                self._io.rmtree(folder.path)
            except OSError:
                pass

    def _forget_after_fork(self) -> None:
        # A forked child shares our descriptor and must never reuse our key or nonces.
        self._lock = threading.RLock()
        self._readers = threading.Condition(self._lock)
        self._enabled, self._closed, self._file = False, True, None
        self._pending = {}
        self._index.clear()


def register(store: Any, *, handle_signals: bool) -> None:
    """Track ``store`` so exit, signals and fork reach it."""
    with _lock:
        _stores.add(store)
    if handle_signals:
        _install_signal_handlers()


def unregister(store: Any) -> None:
    # A timeout, not a wait: on the signal path the main thread may hold this lock.
    if _lock.acquire(timeout=1.0):
        try:
            _stores.discard(store)
        finally:
            _lock.release()


def close_all(stores: list[Any] | None = None) -> None:
    """Close every open store of this process (atexit), or the given ones (signal path)."""
    for store in list(_stores) if stores is None else stores:
        try:
            store.close()
        except Exception:  # noqa: BLE001, S110 - exit paths must never raise
            pass


def _install_signal_handlers() -> None:
    # Only replace default dispositions, only from the main thread: user handlers win.
    global _signals_installed
    if _signals_installed or threading.current_thread() is not threading.main_thread():
        return
    _signals_installed = True
    for signum in _HANDLED:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_signal)
        except (ValueError, OSError):
            pass


def _on_signal(signum: int, frame: Any) -> None:
    # The main thread may be paused inside a store's critical section, holding its locks: such
    # a store cannot be closed, so only the others close (on a helper thread, with a deadline).
    # Then the lock-free part, removing private folders, runs for all, and we die the way the
    # sender meant. An unclosed persistent store keeps the index of its last flush.
    stores = list(_stores)
    closable = [store for store in stores if store._is_closable_now()]
    helper = threading.Thread(target=close_all, args=(closable,), daemon=True)
    helper.start()
    helper.join(_SIGNAL_GRACE_S)
    for store in stores:
        store._remove_folder_now()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # the parent may have held it at fork time
    for store in list(_stores):
        store._forget_after_fork()
    _stores.clear()


atexit.register(close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
