"""`forkv run SPEC`: run a declarative workflow file from the command line.

Loads and checks the `WorkflowSpec` (JSON or YAML) before any model loads, picks the model
(`--model`, else the spec's `model_id`), runs the workflow to the end through a `Session` (keep
rules applied as forks finish), prints one line per node with the tokens restored from
checkpoints, computed and generated and its time, and saves the tree readable by its owner
only (0600) for `forkv show`. With `--ui` the tree also grows live in a browser page
(`forkv.server.run_viewer`). Knows the public SDK only.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from . import interrupts
from .cli import add_kv_dtype_option, add_ram_option, add_speculate_option

__all__ = ["SCORERS", "add_arguments", "run_spec"]

# Keep rules may name these scorers (higher is better); mean_logprob needs the session.
SCORERS = ("mean_logprob", "length", "shortest")


def add_arguments(p) -> None:
    p.add_argument("spec", metavar="SPEC", help="a workflow file: .json, .yaml or .yml")
    p.add_argument("--model", default=None,
                   help="a model name, see `forkv --help` (default: the spec's model_id)")
    p.add_argument("--save", default=None, metavar="TREE.json",
                   help="where to save the tree (default: SPEC's name + .tree.json, here)")
    p.add_argument("--no-progress", action="store_true", help="no prefill progress bar")
    p.add_argument("--ui", action="store_true",
                   help="watch the tree grow in a browser: print a loopback URL whose page "
                        "shows each node and its stats as it runs (kept up after the run "
                        "until Ctrl-C)")
    add_speculate_option(p)
    add_kv_dtype_option(p)
    add_ram_option(p)


def run_spec(args) -> int:
    from forkv.graph import SpecError, WorkflowSpec

    path = Path(args.spec)
    spec = WorkflowSpec.load(path)
    spec.check(scorers=dict.fromkeys(SCORERS))  # every error before the model loads
    model = args.model or (spec.model_id or "").partition("@")[0]
    if not model:
        raise SpecError(f"{str(path)!r} has no model_id; pass --model (e.g. demo:qwen3:tiny) "
                        "or add model_id to the spec.")
    out = Path(args.save) if args.save else Path(path.name).with_suffix(".tree.json")
    viewer = None
    if getattr(args, "ui", False):
        from .server.run_viewer import RunViewer

        viewer = RunViewer(path.name)
        print(f"viewer: {viewer.start()}", flush=True)
    try:
        _run(args, path, spec, model, out, viewer)
        if viewer is not None:
            print(f"viewer: the run has finished; its page stays up at {viewer.url} until "
                  "Ctrl-C", flush=True)
            try:
                # Wake twice a second: a Ctrl-C the kernel hands to another thread only sets
                # Python's flag, and a main thread blocked for good in one wait would not run
                # the handler
                idle = threading.Event()
                while not idle.wait(0.5):
                    pass
            except KeyboardInterrupt:
                viewer.close()
                # the run is done and saved: leave in the fixed order (a plain return left
                # the process alive past a 30 s wait once, on a busy CI machine)
                interrupts.leave(0)
    finally:
        if viewer is not None:
            viewer.close()
    return 0


def _run(args, path: Path, spec, model: str, out: Path, viewer) -> None:
    import forkv

    from .progress import PrefillBar

    t0 = time.perf_counter()
    template = getattr(args, "chat_template", None)
    with forkv.Session(model, tree=spec.build(), chat_template=template,
                       speculate=getattr(args, "speculate", None),
                       kv_dtype=getattr(args, "kv_dtype", None),
                       ram=getattr(args, "ram", None)) as session:
        session.tree.model_id = session.model_id  # pin the fingerprint in what we save
        print(f"{path.name}: {len(spec.nodes)} spec nodes on {session.model_id}", flush=True)
        publish = viewer.publish if viewer is not None else (lambda tree, done=False: None)
        if viewer is not None:
            viewer.model = session.model_id
        publish(session.tree)
        scorers = {"mean_logprob": session.mean_logprob,
                   "length": lambda n: len(n.text or ""),
                   "shortest": lambda n: -len(n.text or "")}
        totals = [0, 0, 0]
        with PrefillBar(force=False if args.no_progress else None) as bar:
            while True:
                for event in session.stream(progress=bar.node):
                    if event.is_last:
                        bar.close()
                        _print_row(session.tree[event.node_id], event, totals)
                        publish(session.tree)
                advanced = spec.advance(session.tree, scorers)
                publish(session.tree)
                if not advanced and not session.tree.pending():
                    break
        session.tree.save(out)  # 0600, also over an existing file
        publish(session.tree, done=True)
    reused, computed, generated = totals
    prompt = max(1, reused + computed)
    print(f"total: reused {reused}, computed {computed} ({reused / prompt:.0%} of prompt tokens "
          f"restored), generated {generated}; {time.perf_counter() - t0:.1f} s")
    print(f"tree: {len(session.tree)} nodes saved to {out}; draw it with `forkv show {out}`")


def _print_row(node, event, totals: list[int]) -> None:
    st, t = event.stats, event.timings or {}
    totals[0] += st.tokens_reused
    totals[1] += st.tokens_computed
    totals[2] += st.tokens_generated
    # The request's own clock (submitted -> last token): nodes of a batched wave overlap.
    first = t.get("first_token_s", 0.0)
    total = first + t.get("decode_s", 0.0)
    print(f"  {node.id:<10} {node.kind:<9} reused {st.tokens_reused:>5}  computed "
          f"{st.tokens_computed:>5}  generated {st.tokens_generated:>4}  first token "
          f"{first:.2f} s  total {total:.2f} s  {event.finish_reason}", flush=True)
