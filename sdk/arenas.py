"""glibc's malloc arenas, bounded in the `forkv` process.

glibc gives threads extra malloc arenas (up to 8 a core) and rarely hands their freed pages
back, so a long-running server whose engine, mlx and request threads allocate and free
buffers all day keeps growing: a 12-minute `forkv bench soak` went from 591 to 737 MiB
(1.25x) with the default arenas and stayed flat (583 to 585 MiB) with two. `limit()` sets two
(mallopt M_ARENA_MAX) before any thread starts, in the CLI process only: a program that
imports forkv keeps its own malloc settings, and MALLOC_ARENA_MAX in the environment wins.

`trim()` hands freed heap pages back after a model loads: parsing a large tokenizer.json and
the weights leaves hundreds of MiB freed but held (Gemma 3 270M: 836 -> 565 MiB RSS right
after `load_model`).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["ARENAS", "limit", "trim"]

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def limit() -> bool:
    """Bound the arenas (True when set); a no-op off glibc or under MALLOC_ARENA_MAX."""
    if os.environ.get("MALLOC_ARENA_MAX") or not _is_glibc():
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, ARENAS))
    except (OSError, AttributeError):
        return False


def trim() -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); True if any were."""
    if not _is_glibc():
        return False
    import gc

    gc.collect()  # the loaders' garbage first, so its pages are free to hand back
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
