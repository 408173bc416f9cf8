"""The `forkv` process bounds glibc's malloc arenas (sdk/arenas.py); a program importing forkv
keeps its own malloc settings, and MALLOC_ARENA_MAX in the environment wins."""

import os
import subprocess
import sys

import pytest

from forkv import arenas

pytestmark = pytest.mark.skipif(not arenas._is_glibc(), reason="glibc's malloc only")

# How many arenas threads end up with: each of 16 threads allocates and holds a block while
# all of them run (glibc hands a contended thread a new arena, up to its limit).
_COUNT = """
import ctypes, sys, threading
{setup}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
start = threading.Barrier(16)
def work():
    start.wait()
    for _ in range(2000):
        libc.free(ctypes.c_void_p(libc.malloc(4096)))
threads = [threading.Thread(target=work) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
fp = libc.fopen(b"/dev/stdout", b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fflush(ctypes.c_void_p(fp))
"""


def _arenas(setup: str, env=None) -> int:
    out = subprocess.run([sys.executable, "-c", _COUNT.format(setup=setup)], text=True,
                         capture_output=True, env={**os.environ, **(env or {})}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.count("<heap nr=")


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
def test_the_cli_process_bounds_the_arenas_and_others_keep_theirs():
    cli = "sys.orig_argv = sys.argv = ['forkv', 'doctor']\nimport forkv"  # as the CLI starts
    assert _arenas(cli) <= arenas.ARENAS
    assert _arenas("import forkv") > arenas.ARENAS  # a program that imports forkv
    assert _arenas(cli, {"MALLOC_ARENA_MAX": "4"}) > arenas.ARENAS  # the user's setting wins


_TRIM = """
import ctypes
from forkv import arenas
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
# 64 MiB in small blocks, all freed but the last: glibc keeps the pages below it
blocks = [libc.malloc(4096) for _ in range(16384)]
for b in blocks[:-1]:
    ctypes.memset(b, 1, 4096)
    libc.free(ctypes.c_void_p(b))
before = rss()
print(arenas.trim(), before - rss())
"""


def test_trim_hands_freed_heap_back_and_loading_a_model_trims(monkeypatch):
    out = subprocess.run([sys.executable, "-c", _TRIM], text=True, capture_output=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    trimmed, freed_kib = out.stdout.split()
    assert trimmed == "True" and int(freed_kib) > 32 * 1024, out.stdout
    from forkv.engine import load_model

    calls = []
    monkeypatch.setattr(arenas, "trim", lambda: calls.append(1) or True)
    load_model("demo:qwen3:tiny")
    assert calls == [1, 1]  # the tokenizer's parse before the weights are read, then the rest


_HELD = """
import ctypes, sys
{setup}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
libc.free(ctypes.c_void_p(libc.malloc(8 << 20)))  # glibc's moving threshold rises past 8 MiB
big, small = [], []
for _ in range(32):  # 32 x 2 MiB, each followed by a smaller block that stays (from the top
    big.append(libc.malloc(2 << 20))  # of the heap, as the big ones: no free hole fits it)
    ctypes.memset(big[-1], 1, 2 << 20)
    small.append(libc.malloc(256 << 10))
before = rss()
for b in big:
    libc.free(ctypes.c_void_p(b))
print(before - rss())
"""


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
def test_the_cli_process_maps_large_blocks_so_freeing_them_hands_them_back():
    def freed_kib(setup: str, env=None) -> int:
        out = subprocess.run([sys.executable, "-c", _HELD.format(setup=setup)], text=True,
                             capture_output=True, env={**os.environ, **(env or {})},
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    cli = "sys.orig_argv = sys.argv = ['forkv', 'doctor']\nimport forkv"
    assert freed_kib(cli) > 56 * 1024  # 64 MiB freed, 64 MiB back
    assert freed_kib("import forkv") < 8 * 1024  # glibc's default: held between the small ones
    assert freed_kib(cli, {"MALLOC_MMAP_THRESHOLD_": str(64 << 20)}) < 8 * 1024  # env wins
