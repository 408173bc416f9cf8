"""How many OpenBLAS threads one matmul gets: all of them, unless the cores are contended.

OpenBLAS splits every large-enough sgemm across its threads and the caller waits for the
last one, spinning. On a quiet machine that halves a 2-core prefill. When other processes
compete for the cores, a thread is often off-CPU when the others finish, so each split
matmul waits out a scheduler time slice: a decode step makes ~130 small matmuls, and a request
took 10x its quiet time at load 7 on 2 cores, far beyond its fair share. So the shim
(`blas.py`) asks, per call: while more threads are runnable on the machine than it has cores
(the instantaneous count in /proc/loadavg, read at most every 20 ms), a matmul under
`FORKV_BLAS_SPLIT_MNK` multiply-adds (default 2^24: decode's per-layer matmuls; not a
prefill chunk's, nor the vocabulary head) runs on one thread. It also starts OpenBLAS with a
short idle spin (`OPENBLAS_THREAD_TIMEOUT`), so an idle worker sleeps after ~0.1 ms instead of
spinning ~0.1 s on a core another process could use. Knows nothing about mlx or models.
"""

from __future__ import annotations

import os

__all__ = ["SPIN_TIMEOUT", "c_source", "prepare_env"]

SPIN_TIMEOUT = "18"  # OpenBLAS idles 2^18 cycles (~0.1 ms) before sleeping; its default is 2^28
_SPLIT_MNK = 1 << 24


def prepare_env() -> None:
    """Before OpenBLAS loads: a short idle spin, unless the user chose one."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_TIMEOUT)


def _split_mnk() -> int:
    try:
        return max(0, int(os.environ.get("FORKV_BLAS_SPLIT_MNK", _SPLIT_MNK)))
    except ValueError:
        return _SPLIT_MNK


def c_source(prefix: str, suffix: str) -> str:
    """C for the shim: `forkv_threads_init(lib)` binds OpenBLAS's thread setter, and
    `forkv_one_thread(m, n, k)` says whether this call should run on one thread (then the
    caller wraps the call in `forkv_set_threads(1)` / `forkv_set_threads(0)`)."""
    return f"""
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static void (*set_threads)(int);
static int max_threads = 1, ncpu = 1, contended;
static int64_t next_probe_ns;
static const double split_mnk = {_split_mnk()}.0;
void forkv_threads_init(void *lib) {{
  int (*get)(void) = (int (*)(void))dlsym(lib, "{prefix}openblas_get_num_threads{suffix}");
  set_threads = (void (*)(int))dlsym(lib, "{prefix}openblas_set_num_threads{suffix}");
  max_threads = get ? get() : 1;
  ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
}}
static int probe(void) {{  /* runnable threads on the machine, ours included */
  char buf[128]; int fd = open("/proc/loadavg", O_RDONLY), running = 0;
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1); close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *p = buf;
  for (int field = 0; field < 3 && p; field++) {{ p = strchr(p, ' '); if (p) p++; }}
  if (p) running = atoi(p);
  return running;
}}
int forkv_one_thread(double m, double n, double k) {{
  if (!set_threads || max_threads < 2 || m * n * k >= split_mnk) return 0;
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  if (now >= next_probe_ns) {{
    contended = probe() > ncpu;
    next_probe_ns = now + 20000000;
  }}
  return contended;
}}
void forkv_set_threads(int n) {{ set_threads(n > 0 ? n : max_threads); }}
"""
