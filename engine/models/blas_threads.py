"""How many OpenBLAS threads one matmul gets: one for small matmuls, all of them otherwise.

OpenBLAS splits every large-enough sgemm across its threads and the caller waits for the
last one, spinning. On a quiet machine that speeds a 2-core prefill up. When other processes
compete for the cores, a thread is often off-CPU when the others finish, so each split
matmul waits out a scheduler time slice: a decode step makes ~130 small matmuls, and a request
took 10x its quiet time beside 2 busy processes on 2 cores, far beyond its fair share. So the
shim (`blas.py`) runs a matmul under `FORKV_BLAS_SPLIT_MNK` multiply-adds (default 2^24:
decode's per-layer matmuls; not a prefill chunk's, nor the vocabulary head) on one thread,
and starts OpenBLAS with a short idle spin (`OPENBLAS_THREAD_TIMEOUT`), so an idle worker
sleeps after ~0.1 ms instead of spinning ~0.1 s on a core another process could use.

The choice is a pure function of the shape, never of the machine's load: OpenBLAS's result
for a shape can depend on its thread count (measured: 50 of 400 random shapes differ between
1 and 2 threads here, e.g. with K = 1030 — attention over a context), and a record must compute
exactly what a fresh run computes. The thread count is a process-wide global, so each call
holds a lock while it sets and uses it. Knows nothing about mlx or models.
"""

from __future__ import annotations

import os

__all__ = ["SPIN_TIMEOUT", "c_source", "prepare_env", "split_mnk"]

active_split_mnk: int | None = None  # the threshold compiled into the loaded shim
SPIN_TIMEOUT = "18"  # OpenBLAS idles 2^18 cycles (~0.1 ms) before sleeping; its default is 2^28
_SPLIT_MNK = 1 << 24


def prepare_env() -> None:
    """Before OpenBLAS loads: a short idle spin, unless the user chose one."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_TIMEOUT)


def split_mnk() -> int:
    try:
        return max(0, int(os.environ.get("FORKV_BLAS_SPLIT_MNK", _SPLIT_MNK)))
    except ValueError:
        return _SPLIT_MNK


def c_source(prefix: str, suffix: str) -> str:
    """C for the shim: `forkv_threads_init(lib)` binds OpenBLAS's thread setter, and
    `forkv_one_thread(m, n, k)` says whether this call should run on one thread (then the
    caller wraps the call in `forkv_set_threads(1)` / `forkv_set_threads(0)`)."""
    global active_split_mnk
    active_split_mnk = split_mnk()
    return f"""
#include <pthread.h>
static void (*set_threads)(int);
/* OpenBLAS's thread count is one global, and its result for a shape can depend on it (e.g.
   K = 1030): a thread's choice must not leak into another thread's call. */
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static int max_threads = 1;
static const double split_mnk = {active_split_mnk}.0;
void forkv_threads_init(void *lib) {{
  int (*get)(void) = (int (*)(void))dlsym(lib, "{prefix}openblas_get_num_threads{suffix}");
  set_threads = (void (*)(int))dlsym(lib, "{prefix}openblas_set_num_threads{suffix}");
  max_threads = get ? get() : 1;
}}
int forkv_one_thread(double m, double n, double k) {{
  /* A pure function of the shape: records must compute exactly what a fresh run does, and
     OpenBLAS's result for a shape may depend on how many threads split it. */
  return set_threads && max_threads > 1 && m * n * k < split_mnk;
}}
void forkv_set_threads(int n) {{ set_threads(n > 0 ? n : max_threads); }}
void forkv_lock(void) {{ pthread_mutex_lock(&call_lock); }}
void forkv_unlock(void) {{ pthread_mutex_unlock(&call_lock); }}
"""
