"""`forkv bench ...`: its options, running benchmarks, printing their figures as a table,
writing JSON (and reports)."""

from __future__ import annotations

import json
import sys
import time

from . import BENCHMARKS, available, run_benchmark
from .common import write_json

_WHAT = {
    "rewind": "time to first token after a rewind: restore vs recompute",
    "agent": "branch-and-prune and tree-of-thought agents vs plain mlx-lm",
    "parallel": "batched vs one-after-another conversations",
    "memory": "checkpoint RAM vs keeping every record in RAM",
    "image": "vision: the same image asked again",
    "store": "encrypted disk tier restore vs the same tier without AES",
    "blas": "prefill with OpenBLAS vs mlx's stock BLAS",
    "constrained": "what a JSON-schema-constrained row costs the rest of its batch",
    "serve": "forkv serve vs mlx_lm.server, through the openai client",
    "cluster": "3 forkv serve replicas: prefix-affinity routing vs round robin",
    "weights": "prefill and decode per weight format (f32, bf16, 4-bit kept or dequantized)",
    "restore": "a long restore split into record reads, cache building and the rest",
    "contention": "one request's slowdown beside 2 and 4 busy processes vs its fair share",
    "depth": "per-turn cost of a linear conversation as it grows (render vs engine)",
    "decode": "single-stream decode with exact speculation vs llama-server's spec types",
    "kv": "perplexity, bytes per token and speed per cached K/V format (f16, bf16, q8_0, f32)",
}


def add_arguments(p) -> None:
    p.epilog = "benchmarks:\n" + "\n".join(
        f"  {name:<9} {_WHAT.get(name, '')}" for name in BENCHMARKS) + (
        "\n  all       every benchmark (--report DIR writes JSON, plots and a summary)"
        "\n  soak      one forkv serve under mixed traffic for --minutes: nothing may grow "
        "(not in all)")
    p.add_argument("name", metavar="NAME", help=f"one of {', '.join(BENCHMARKS)}, soak, or all")
    p.add_argument("--model", action="append", default=None,
                   help="demo:<arch>[:<size>] or a model folder; repeatable")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default per benchmark)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a benchmark's own setting, repeatable: sizes=512,2048 (rewind), "
                        "prompt_tokens=4096 or modes=none,baseline,forkv (memory), "
                        "context=2048 (agent), prefix=4096 (store), cases=fork,rewind, "
                        "vllm=on|off|auto, llamacpp=on|off|auto, exact=on|off, "
                        "mlx_lm=on|off, drift=auto|on|off or doc_tokens=2048 (serve)")
    p.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                   help="also write the full results as JSON to PATH ('-': stdout, no table)")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="(bench all) write JSON, plots and a summary into DIR")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if any figure misses its target, with a line naming each on "
                        "stderr (without it a miss shows as NO and the exit status is 0)")
    soak = p.add_argument_group("soak (forkv bench soak: one forkv serve under mixed traffic)")
    soak.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    soak.add_argument("--tenants", type=int, default=16, help="tenants (default 16)")
    soak.add_argument("--models", default=None, metavar="A,B",
                      help="models to send traffic to (default demo:qwen3:tiny,demo:gemma3:tiny)")
    soak.add_argument("--clients", type=int, default=8, help="client threads (default 8)")
    soak.add_argument("--sample-s", type=float, default=60.0, metavar="S",
                      help="seconds between samples (default 60)")
    soak.add_argument("--warmup-s", type=float, default=None, metavar="S",
                      help="judge growth from the sample at S seconds (default: a sixth of "
                           "the run)")
    soak.add_argument("--plot", default=None, metavar="PATH",
                      help="write the curves: .svg by hand, other suffixes with matplotlib")


def run_cli(args) -> int:
    if args.name == "soak":
        return _run_soak(args)
    names = available() if args.name == "all" else [args.name]
    if args.name != "all" and args.name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {args.name!r}; choose one of "
                         f"{', '.join(list(BENCHMARKS) + ['all'])}.")
    if args.name == "all" and args.set:
        raise ValueError("--set applies to one benchmark; run `forkv bench NAME --set ...`.")
    to_stdout = args.json_path == "-"
    results = {}
    for name in names:
        t0 = time.perf_counter()
        models = args.model if args.name != "all" else None
        res = run_benchmark(name, models, quick=args.quick, reps=args.reps, settings=args.set)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results[name] = res
        if not to_stdout:
            print(format_table(name, res), flush=True)
        if args.report:
            write_json(res, f"{args.report}/{name}.json")
    out = results[names[0]] if len(names) == 1 else results
    if to_stdout:
        print(json.dumps(out, indent=1, default=str))
    elif args.json_path:
        write_json(out, args.json_path)
    if args.report:
        from .report import write_report

        write_report(results, args.report)
    if args.check:
        from .report import missed_targets

        missed = missed_targets(results)
        if missed:
            print(f"forkv bench: {len(missed)} target{'s' * (len(missed) > 1)} missed: "
                  + "; ".join(missed), file=sys.stderr)
            return 1
    return 0


def _run_soak(args) -> int:
    from .soak import DEFAULT_MODELS, run_soak

    if args.set or args.report or args.quick or args.reps is not None:
        raise ValueError("soak takes --minutes, --tenants, --models, --clients, --sample-s, "
                         "--warmup-s, --json and --plot, not --set, --report, --quick or "
                         "--reps.")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models \
        else tuple(args.model or DEFAULT_MODELS)
    t0 = time.perf_counter()
    res = run_soak(minutes=args.minutes, tenants=args.tenants, models=models,
                   clients=args.clients, sample_s=args.sample_s, warmup_s=args.warmup_s,
                   plot=args.plot)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json_path == "-":
        print(json.dumps(res, indent=1, default=str))
    else:
        print(format_table("soak", res), flush=True)
        if args.json_path:
            write_json(res, args.json_path)
    return 0 if res["headline"]["soak_ok"] else 1


def format_table(name: str, res: dict) -> str:
    """The headline figures of one benchmark as an aligned text table."""
    runs = res.get("runs") or [res]
    rows = [("figure", "model", "value", "target", "met")]
    for run in runs:
        model = str(run.get("model", "")).replace("demo:", "")
        for key, value in run["headline"].items():
            target = run.get("targets", {}).get(key) or {}
            met = target.get("met")
            rows.append((key, model, _fmt(value), target.get("target", ""),
                         "yes" if met else "NO" if met is False else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{name} ({res.get('wall_s', '?')} s)"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"  # not measured in this run (e.g. a size --quick does not reach)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v)
