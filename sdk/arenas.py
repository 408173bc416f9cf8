"""glibc's malloc arenas, bounded in the `forkv` process.

glibc gives threads extra malloc arenas (up to 8 a core) and rarely hands their freed pages
back, so a long-running server whose engine, mlx and request threads allocate and free
buffers all day keeps growing: a 12-minute `forkv bench soak` went from 591 to 737 MiB
(1.25x) with the default arenas and stayed flat (583 to 585 MiB) with two. `limit()` sets two
(mallopt M_ARENA_MAX) before any thread starts, in the CLI process only: a program that
imports forkv keeps its own malloc settings, and MALLOC_ARENA_MAX in the environment wins.

`limit()` also fixes glibc's mmap threshold at 1 MiB. glibc raises it after each freed mmapped
block (up to 32 MiB), so the multi-MiB buffers of checkpoint records and request bodies land on
the heap and stay held once freed: RSS then follows the largest moment of the past, not what is
live (Gemma 3 270M, an 8K-token prompt: 754 MiB after it with the moving threshold, 665 with a
fixed one). Blocks of 1 MiB and up are mapped and unmapped whole, at a page fault a 4 KiB page.

`usage()` splits malloc's heap into what is allocated and what is freed but held, so a
growing resident set can be told apart: live native allocations (a leak, or a cache that keeps
growing) or freed memory malloc keeps (fragmentation, which `trim()` can hand back).

`trim()` hands freed heap pages back after a model loads: parsing a large tokenizer.json and
the weights leaves hundreds of MiB freed but held (Gemma 3 270M: 836 -> 565 MiB RSS right
after `load_model`). The engine thread also trims when it runs out of work, at most every
`IDLE_TRIM_S` seconds: a 32K-token prompt's record and prefill buffers, freed but held, are
~55 MiB of Gemma 3 270M's RSS after it.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["ARENAS", "IDLE_TRIM_S", "limit", "threshold_fixed", "trim", "usage"]

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20
IDLE_TRIM_S = 10.0
_fixed = False  # whether limit() fixed the mmap threshold in this process


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def limit() -> bool:
    """Bound the arenas and fix the mmap threshold (True when the arenas were set); a no-op
    off glibc, and each setting left alone where its MALLOC_* variable is in the environment."""
    if not _is_glibc():
        return False
    global _fixed
    try:
        libc = ctypes.CDLL(None)
        if not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
            _fixed = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        return not os.environ.get("MALLOC_ARENA_MAX") and bool(libc.mallopt(_M_ARENA_MAX,
                                                                             ARENAS))
    except (OSError, AttributeError):
        return False


def threshold_fixed() -> bool:
    """Whether `limit()` fixed the mmap threshold here: blocks of 1 MiB and up are mapped on
    every malloc and unmapped on every free (engine/request/buffers.py keeps a decode step's
    out of malloc)."""
    return _fixed


def trim(collect: bool = True) -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); True if any were.
    `collect` runs Python's garbage collector first, so what it frees is handed back too."""
    if not _is_glibc():
        return False
    if collect:
        import gc

        gc.collect()
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33's struct mallinfo2, all size_t
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def usage() -> dict[str, int]:
    """{"malloc_in_use": bytes allocated (heap chunks and mmapped blocks), "malloc_free":
    freed bytes malloc still holds, some of them already handed back by `trim()`}, summed over
    the arenas; {} off glibc or before 2.33. Python's small objects live in its own arenas
    (pymalloc), outside both."""
    if not _is_glibc():
        return {}
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"malloc_in_use": int(info.uordblks + info.hblkhd), "malloc_free": int(info.fordblks)}
