"""`forkv bench memory`: the RAM that block checkpoints cost while 4 long prompts are live.

Each mode runs in its own child process so resident memory is measured cleanly: the child
loads the model, notes its RSS, then prefills 4 prompts of N tokens (8K by default) and keeps
all 4 sequences live, sampling RSS every 20 ms. Modes:

- none: checkpoints off, what the model itself needs for the same work (its live caches of
  all 4 prompts, activations, allocator slack);
- forkv: the defaults (global records hot in RAM under the RAM budget, window/state records
  sealed to the encrypted disk tier as soon as they are made);
- baseline (opt-in): every block checkpoint kept in RAM (what an in-memory prompt cache does).

The headline compares the extra RAM of checkpointing above `none`. Keeping every record in RAM
costs at least the records' own bytes, which the forkv run counts exactly: that lower bound is
the baseline unless the `baseline` mode runs (measured, it adds allocator slack on top: 8% in
the report before the current one; skipping it saves a third of this benchmark's time). The peak
above the model's weights alone is reported too (`modes` can add "forkv-budget:<size>" runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .common import result

_CHILD = r"""
import json, sys, threading, time
from forkv.engine.models import blas
blas.activate()
import mlx.core as mx
from forkv.engine import Engine, load_model
from forkv.engine.request.generate import prefill
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.engine import make_record_store
from forkv.security import StoreSettings
from forkv.bench.common import random_tokens

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

model, mode, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lm = load_model(model)
mx.eval(lm.model.parameters()); mx.clear_cache()
base = rss()
samples, done = [], False
def sample():
    t0 = time.perf_counter()
    while not done:
        samples.append((time.perf_counter() - t0, rss() - base)); time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
if mode == "none":
    store = RecordStore(0, None)  # checkpoints off: what the 4 prompts need by themselves
elif mode == "baseline":
    store = RecordStore(1 << 44, None)  # every record stays in RAM
elif mode == "forkv":
    store = make_record_store(StoreSettings.from_env())
else:
    store = make_record_store(StoreSettings.from_env(ram_budget=mode.split(":")[1]))
engine = Engine(lm, store=store)

def prefill_all():  # on the engine thread, which owns every mlx call
    live = []
    for i in range(k):
        tokens = random_tokens(n, seed=100 + i)
        restored = engine.checkpointer.restore(tokens)
        hook = None if mode == "none" else engine.checkpointer.recorder(restored.keys)
        prefill(lm.model, restored.cache, tokens, restored.position, engine.block_size, hook)
        live.append(restored.cache)  # all k sequences stay live
    return live, sum(c.nbytes for cache in live for c in cache)

live, live_bytes = engine.run_on_thread(prefill_all)
store.flush()
time.sleep(0.2)
done = True
peak = max(v for _, v in samples)
print(json.dumps({"mode": mode, "model_rss": base, "peak_extra": peak, "ram_tier": store.ram_bytes,
                  "record_bytes": store.stats.bytes_put, "live_cache_bytes": live_bytes,
                  "samples": samples[:: max(1, len(samples) // 400)]}))
engine.close()
"""


def _child(model: str, mode: str, n: int, k: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, model, mode, str(n), str(k)],
                         env=dict(os.environ), capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"memory bench child ({mode}) failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_memory_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 1,
                     prompt_tokens: int = 8192, prompts: int = 4,
                     modes: tuple[str, ...] = ("none", "forkv")) -> dict:
    if quick:
        prompt_tokens, prompts = 1024, 2
    modes = list(dict.fromkeys(("none", "forkv", *modes)))  # the headline needs both
    runs = {m: [] for m in modes}
    for _ in range(reps):
        for m in modes:
            runs[m].append(_child(model, m, prompt_tokens, prompts))
    cases = []
    for m, rs in runs.items():
        best = min(rs, key=lambda r: r["peak_extra"])
        cases.append({"mode": m, "peak_extra_bytes": best["peak_extra"],
                      "model_rss_bytes": best["model_rss"], "ram_tier_bytes": best["ram_tier"],
                      "record_bytes": best["record_bytes"],
                      "live_cache_bytes": best["live_cache_bytes"],
                      "rss_over_time": best["samples"]})
    peak = {c["mode"]: c["peak_extra_bytes"] for c in cases}
    own = peak["none"]  # what the same 4 prompts need without any checkpoint
    record_bytes = next(c["record_bytes"] for c in cases if c["mode"] == "forkv")
    if "baseline" in peak:
        baseline_extra, source = peak["baseline"] - own, "measured (baseline mode)"
    else:
        baseline_extra, source = record_bytes, "the records' bytes (lower bound)"

    def reduction(mode: str) -> float:
        return round(1 - (peak[mode] - own) / max(1, baseline_extra), 3)

    for c in cases:
        c["checkpoint_extra_bytes"] = c["peak_extra_bytes"] - own
    headline = {"extra_ram_reduction": reduction("forkv"),
                "peak_reduction": round(1 - peak["forkv"] / (own + baseline_extra), 3)}
    for m in modes:
        if m.startswith("forkv-budget:"):
            headline[f"extra_ram_reduction_{m}"] = reduction(m)
    return result("memory", model, {"prompt_tokens": prompt_tokens, "prompts": prompts,
                                    "reps": reps, "modes": modes,
                                    "baseline_extra_bytes": baseline_extra,
                                    "baseline_extra_from": source},
                  cases, headline, {"extra_ram_reduction": ">= 0.85"},
                  notes=["peak_extra = peak RSS minus RSS after loading the model; every mode "
                         "holds the same live caches of all prompts.",
                         "extra_ram_reduction = 1 - (forkv - none) / baseline extra, where the "
                         "baseline keeps every record in RAM: its extra RAM above none is "
                         f"{source}. peak_reduction compares the whole peaks above the weights "
                         "(none + that extra for the baseline), live caches included."])
