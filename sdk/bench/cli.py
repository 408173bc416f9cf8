"""`forkv bench ...`: run benchmarks, print their headlines, write JSON (and reports)."""

from __future__ import annotations

import json
import time

from . import BENCHMARKS, available, run_benchmark
from .common import write_json


def run_cli(args) -> int:
    names = available() if args.name == "all" else [args.name]
    if args.name != "all" and args.name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {args.name!r}; choose one of "
                         f"{', '.join(list(BENCHMARKS) + ['all'])}.")
    if args.name == "all" and args.set:
        raise ValueError("--set applies to one benchmark; run `forkv bench NAME --set ...`.")
    results = {}
    for name in names:
        t0 = time.perf_counter()
        models = args.model if args.name != "all" else None
        res = run_benchmark(name, models, quick=args.quick, reps=args.reps, settings=args.set)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results[name] = res
        print(f"{name}: {json.dumps(res['headline'])}  ({res['wall_s']} s)", flush=True)
        if args.report:
            write_json(res, f"{args.report}/{name}.json")
    if args.json_path:
        write_json(results[names[0]] if len(names) == 1 else results, args.json_path)
    if args.report:
        from .report import write_report

        write_report(results, args.report)
    return 0
