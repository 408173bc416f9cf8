"""A burst under the RAM budget: peak RSS and tokens with and without a tight `--ram`.

`python -m forkv.bench.ram_burst MODEL [RAM ...] [--n 8] [--length 1024] [--max-tokens 16]`
submits N distinct prompts of LENGTH tokens at once (greedy) to an engine with each RAM
setting, every setting in a child process of its own so its peak RSS (VmHWM) is its own; one
JSON line per setting: peak RSS, RSS after the load, wall time, how many requests waited for
room, and a digest of every token generated (equal digests: the budget changed no token).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import hashlib, json, sys, time
from forkv.engine.models import blas
blas.activate()
import forkv
from forkv.engine import SamplingParams
from forkv.bench.common import random_tokens

model, ram, n, length, m = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmHWM"))
engine = forkv.load(model, ram=ram)
loaded = hwm()
prompts = [random_tokens(length, seed=i) for i in range(n)]  # (ids < 256: any model has them)
t = time.perf_counter()
handles = [engine.submit(p, SamplingParams(max_tokens=m, temperature=0)) for p in prompts]
tokens = [h.result().token_ids for h in handles]
wall = time.perf_counter() - t
budget = engine.stats()["ram_budget"]
engine.close()
print(json.dumps({"ram": ram, "peak_rss_mib": hwm(), "rss_after_load_mib": loaded,
                  "wall_s": round(wall, 2), "waits": budget["waits"],
                  "tokens_sha256": hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]}))
"""


def run(model: str, rams: list[str], n: int = 8, length: int = 1024,
        max_tokens: int = 16) -> list[dict]:
    """One child process per RAM setting; their results, in order."""
    out = []
    for ram in rams:
        proc = subprocess.run([sys.executable, "-c", _CHILD, model, ram, str(n), str(length),
                               str(max_tokens)], capture_output=True, text=True, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forkv.bench.ram_burst", description=__doc__)
    p.add_argument("model")
    p.add_argument("ram", nargs="*", default=["off", "2GiB", "64MiB"])
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args(argv)
    for row in run(args.model, args.ram, args.n, args.length, args.max_tokens):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
