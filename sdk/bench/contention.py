"""`forkv bench contention`: one request's time while busy processes compete for the cores.

A fixed request (a short chat, 24 greedy tokens, no checkpoints so every rep computes the
same) is timed alone, then beside b busy single-threaded Python loops, then alone again (the
quiet time is the median of both quiet sets, so a drifting machine shows in their spread).
With c cores a fair scheduler gives our c threads c/(b+c) of the machine, so the request
should take (b+c)/c of its quiet time; the target allows 30% over that: 2.6x with two busy
processes on 2 cores, 3.9x with four. The busy loops end by themselves after a deadline and
are killed when the benchmark ends. The machine's other load is not ours to control: quiet
figures on a shared machine are noisy; rerun on a quiet one.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from .common import result, summary

PROMPT = "Write two sentences about the sea and the wind over it."
_BUSY = "import time\nt = time.monotonic() + {s}\nwhile time.monotonic() < t:\n    pass\n"


def fair_target(busy: int, cores: int) -> float:
    """The most a request may take, as a multiple of its quiet time, beside `busy` loops."""
    return round(1.3 * (busy + cores) / cores, 2)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _start_busy(n: int, deadline_s: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", _BUSY.format(s=deadline_s)],
                             stdin=subprocess.DEVNULL) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _time_reps(engine, prompt, reps: int, gen_tokens: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(reps):
        c0, t0 = _cpu_s(), time.perf_counter()
        engine.generate(prompt, max_tokens=gen_tokens, temperature=0.0)
        walls.append(round(time.perf_counter() - t0, 3))
        cpus.append(round(_cpu_s() - c0, 3))
    return walls, cpus


def run_contention_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 3,
                         busy: tuple[int, ...] = (2, 4), gen_tokens: int = 24) -> dict:
    """`reps` timings of the request alone, beside each count of `busy` loops, then alone."""
    from forkv.engine import Engine, load_model

    if quick:
        reps, busy, gen_tokens = 1, (2,), 8
    cores = _cores()
    lm = load_model(model)
    engine = Engine(lm, checkpoints=False)
    prompt = ([{"role": "user", "content": PROMPT}] if lm.tokenizer.chat_template else PROMPT)
    engine.generate(prompt, max_tokens=2)  # warm-up: kernels, caches
    runs: dict[int, tuple[list[float], list[float]]] = {}
    quiet = _time_reps(engine, prompt, reps, gen_tokens)
    deadline_s = 600.0 if not quick else 120.0
    for b in busy:
        procs = _start_busy(b, deadline_s)
        try:
            time.sleep(0.3)  # let them reach the cores
            runs[b] = _time_reps(engine, prompt, reps, gen_tokens)
        finally:
            _stop(procs)
    again = _time_reps(engine, prompt, reps, gen_tokens)
    engine.close()
    quiet_s = summary(quiet[0] + again[0])
    cases = [{"busy": 0, "wall_s": quiet_s, "cpu_s": summary(quiet[1] + again[1]),
              "slowdown": 1.0, "target": 1.3}]
    headline: dict = {"quiet_s": round(quiet_s["median"], 2)}
    targets: dict = {}
    for b, (walls, cpus) in runs.items():
        slow = round(summary(walls)["median"] / quiet_s["median"], 2)
        cases.append({"busy": b, "wall_s": summary(walls), "cpu_s": summary(cpus),
                      "slowdown": slow, "target": fair_target(b, cores)})
        headline[f"slowdown_busy{b}"] = slow
        targets[f"slowdown_busy{b}"] = f"<= {fair_target(b, cores)}"
    notes = [f"{cores} cores; target = 1.3 x (busy + cores) / cores of the quiet time",
             f"quiet before: {quiet[0]}, after: {again[0]}",
             f"load average at the end: {os.getloadavg()[0]:.2f} (other processes count too)"]
    return result("contention", model,
                  {"reps": reps, "busy": list(busy), "gen_tokens": gen_tokens, "cores": cores,
                   "prompt": PROMPT, "checkpoints": False,
                   "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                   "blas_split_mnk": os.environ.get("FORKV_BLAS_SPLIT_MNK", "default")},
                  cases, headline, targets, notes, dtype=lm.dtype)
