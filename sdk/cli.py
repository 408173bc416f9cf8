"""The `forkv` command line: demo, generate, doctor (and bench/show as they land)."""

from __future__ import annotations

import argparse
import json
import sys

from forkv.engine import blas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run the branch-and-prune demo on a built-in model")
    p.add_argument("--model", default="demo:gemma3:tiny", help="demo:<arch>[:<size>] or a folder")
    p.add_argument("--max-tokens", type=int, default=48)

    p = sub.add_parser("generate", help="stream a completion of a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default="demo:qwen3:tiny")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn")

    p = sub.add_parser("doctor", help="report BLAS, dtype, device and versions")
    p.add_argument("--model", default=None, help="also load this model and report its layout")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="run a benchmark (rewind, agent, parallel, memory, image, "
                                     "store, blas, all)")
    p.add_argument("name")
    p.add_argument("--model", action="append", default=None,
                   help="demo:<arch>[:<size>] or a model folder; repeatable")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a benchmark's own setting, repeatable: sizes=512,2048 (rewind), "
                        "prompt_tokens=4096 or modes=none,baseline,forkv (memory), "
                        "context=2048 (agent), prefix=4096 (store)")
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    p.add_argument("--report", default=None, help="(bench all) write JSON, plots, summary here")

    p = sub.add_parser("show", help="write a saved tree as a self-contained HTML page")
    p.add_argument("tree", help="a tree saved with Session.save / Tree.save (JSON)")
    p.add_argument("-o", "--output", default=None, help="HTML file (default: TREE.html)")

    from forkv.server.serve import add_arguments as add_serve

    add_serve(sub.add_parser("serve", help="serve a model over the OpenAI API (chat "
                                           "completions, responses)"))

    args = parser.parse_args(argv)
    blas.activate()  # before anything imports mlx
    try:
        return _COMMANDS[args.command](args)
    except (ValueError, OSError) as e:  # our typed errors subclass ValueError
        print(f"forkv: error: {e}", file=sys.stderr)
        return 2


def _demo(args) -> int:
    from forkv.sdk_demo import run_demo

    return run_demo(args.model, args.max_tokens)


def _generate(args) -> int:
    import forkv

    engine = forkv.load(args.model)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    params = forkv.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                  top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                  stop=tuple(args.stop))
    for event in engine.stream(prompt, params):
        print(event.text, end="", flush=True)
    t = event.timings
    print(f"\n[{event.finish_reason}] prompt {t.prompt_tokens} tok, prefill {t.prefill_tps:.0f} tok/s,"
          f" decode {t.decode_tps:.1f} tok/s, first token {t.first_token_s * 1000:.0f} ms",
          file=sys.stderr)
    return 0


def _doctor(args) -> int:
    from forkv.doctor import report

    info = report(args.model)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v}")
    return 0


def _bench(args) -> int:
    from forkv.bench.cli import run_cli

    return run_cli(args)


def _show(args) -> int:
    from pathlib import Path

    from forkv.graph import Tree, write_html

    src = Path(args.tree)
    tree = Tree.load(src)  # no model needed: the page shows what the tree recorded
    out = write_html(tree, args.output or src.with_suffix(".html"), title=f"forkv: {src.name}")
    print(f"wrote {out} ({len(tree)} nodes)")
    return 0


_COMMANDS = {"demo": _demo, "generate": _generate, "doctor": _doctor, "bench": _bench}
_COMMANDS["show"] = _show


def _serve(args) -> int:
    from forkv.server.serve import run_serve

    return run_serve(args)


_COMMANDS["serve"] = _serve

if __name__ == "__main__":
    sys.exit(main())
