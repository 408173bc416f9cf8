"""`forkv bench blas`: prefill and decode speed with the optimized BLAS vs mlx's stock one.

The BLAS is bound when mlx is first imported, so each measurement runs in a fresh child
process (`FORKV_BLAS=off` or `auto`); the two alternate, rep by rep, in one command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import result, summary

_CHILD = r"""
import json, sys, time
from forkv.engine.models import blas
info = blas.activate()
from forkv.engine import Engine, load_model
from forkv.bench.common import random_tokens
lm = load_model(sys.argv[1], dtype=sys.argv[4])
engine = Engine(lm, checkpoints=False)
n, gen = int(sys.argv[2]), int(sys.argv[3])
engine.generate(random_tokens(64, seed=0), max_tokens=2)  # warm-up
out = engine.generate(random_tokens(n, seed=1), max_tokens=gen)
print(json.dumps({"blas": info.name, "optimized": info.is_optimized,
                  "gflops": blas.measure_gflops("float32", 1024, 3),
                  "prefill_tps": out.timings.prefill_tps, "decode_tps": out.timings.decode_tps}))
"""


def _child(mode: str, model: str, n: int, gen: int, dtype: str) -> dict:
    env = dict(os.environ, FORKV_BLAS=mode)
    out = subprocess.run([sys.executable, "-c", _CHILD, model, str(n), str(gen), dtype],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"blas bench child ({mode}) failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_blas_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 2,
                   prompt_tokens: int = 512, gen_tokens: int = 16,
                   dtype: str = "float32", baseline_reps: int = 1) -> dict:
    """`reps` runs with the optimized BLAS; stock BLAS (a minute per run at ~10 tokens/s, and
    steady to a few percent) runs in the first `baseline_reps` of them, interleaved."""
    if quick:
        reps, prompt_tokens, gen_tokens = 1, 256, 4
    runs = {"off": [], "auto": []}
    for r in range(reps):
        for mode in runs:
            if mode == "off" and r >= baseline_reps:
                continue
            runs[mode].append(_child(mode, model, prompt_tokens, gen_tokens, dtype))
    cases = []
    for mode, rs in runs.items():
        cases.append({"mode": mode, "blas": rs[0]["blas"], "optimized": rs[0]["optimized"],
                      "prefill_tps": summary([r["prefill_tps"] for r in rs]),
                      "decode_tps": summary([r["decode_tps"] for r in rs]),
                      "matmul_gflops_f32": summary([r["gflops"] for r in rs])})
    off, auto = cases
    headline = {
        "prefill_speedup": round(auto["prefill_tps"]["median"] / off["prefill_tps"]["median"], 2),
        "decode_speedup": round(auto["decode_tps"]["median"]
                                / max(off["decode_tps"]["median"], 1e-9), 2),
        "optimized_blas": auto["blas"],
    }
    notes = [] if auto["optimized"] else ["no optimized BLAS found: both runs used stock BLAS"]
    return result("blas", model, {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
                                  "reps": reps, "baseline_reps": baseline_reps,
                                  "dtype": dtype},
                  cases, headline, {"prefill_speedup": ">= 10"}, notes, dtype=dtype)
