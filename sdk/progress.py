"""A prefill progress bar for the command line (tqdm, on stderr).

`PrefillBar` is the callback the engine calls after each prefill chunk,
`bar(computed, total, restored)`: tokens of the prompt computed so far (restored ones not
counted), the prompt's length, and how many were restored from checkpoints. It draws only when
the prompt has enough tokens left to compute to be worth a bar (`min_tokens`) and stderr is a
terminal (or `force=True`), so short prompts and pipes stay quiet. Knows nothing about the
engine: any caller that counts tokens can drive it.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

__all__ = ["PrefillBar"]


class PrefillBar:
    """Shows `label: ▇▇▇▁▁ computed/total tok [restored R]` while a long prompt prefills.

    One bar per prompt: a call with a new `total` (another prompt) closes the old bar and
    starts another. Safe to call from the engine's thread.
    """

    def __init__(self, label: str = "prefill", *, min_tokens: int = 2048,
                 force: bool | None = None, file: TextIO | None = None):
        self.label = label
        self.min_tokens = min_tokens
        self.file = file or sys.stderr
        self.enabled = force if force is not None else _is_tty(self.file)
        self._bar = None
        self._total = None
        self._node: str | None = None
        self._lock = threading.RLock()

    def __call__(self, computed: int, total: int, restored: int = 0) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None and total != self._total:
                self._close()
            done = restored + computed
            if self._bar is None:
                if total - restored < self.min_tokens or done >= total:
                    return  # short (or already finished): no bar
                self._open(total, restored)
            self._bar.n = done
            self._bar.set_postfix_str(f"restored {restored:,}", refresh=False)
            self._bar.refresh()
            if done >= total:
                self._close()

    def node(self, node_id: str, computed: int, total: int, restored: int = 0) -> None:
        """The `Session.run(progress=...)` form: one bar per node, labelled with its id; while
        one node's bar shows, other nodes prefilling beside it (a batched wave) wait."""
        with self._lock:
            if self._bar is not None and self._node != node_id:
                return
            if self._bar is None:
                self._node, self.label = node_id, f"prefill {node_id}"
        self(computed, total, restored)

    def relabel(self, label: str) -> None:
        """Name the next bar (e.g. after the node a workflow runs next)."""
        with self._lock:
            self._close()
            self.label = label

    def close(self) -> None:
        with self._lock:
            self._close()

    def __enter__(self) -> PrefillBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self, total: int, restored: int) -> None:
        from tqdm import tqdm

        self._total = total
        self._bar = tqdm(total=total, initial=restored, desc=self.label, unit="tok",
                         unit_scale=True, file=self.file, leave=False, dynamic_ncols=True,
                         mininterval=0.2)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._total = None, None


def _is_tty(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False
