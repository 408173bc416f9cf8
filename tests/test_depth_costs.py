"""A turn costs its own tokens at any depth: the Python a Session turn runs in the graph, the
prefix cache and the SDK (both threads: the caller's and the engine's) does not grow with the
path above it. Counted in lines run (sys.settrace), not timed: a loop over a deep path's
nodes, block keys or turn ends shows up as lines, whatever the machine's load. The keys a
deep turn records equal keys from scratch (test_graph_render_depth.py, test_turns.py)."""

from __future__ import annotations

import collections
import os
import sys

from conftest import load_tiny, scoped_engine
from forkv import Session

_ROOT = os.path.dirname(os.path.dirname(sys.modules["forkv.graph"].__file__))
_WHERE = tuple(os.path.join(_ROOT, d) + os.sep for d in ("graph", "engine/cache", "sdk"))


class _Lines:
    """Counts the lines run in forkv's graph/, engine/cache/ and sdk/ by function."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()

    def __call__(self, frame, event, arg):
        where = frame.f_code.co_filename
        if not where.startswith(_WHERE):
            return None
        name = (where[len(_ROOT):], frame.f_code.co_name)

        def local(frame, event, arg):
            if event == "line":
                self.counts[name] += 1
            return local

        return local


def test_a_deep_turn_runs_no_more_python_than_a_shallow_one():
    engine = scoped_engine(load_tiny("qwen3"))
    session = Session(engine)
    node = session.system("You are terse.")
    lines, seen = _Lines(), {}
    for turn in range(1, 51):
        answer = node.user(f"Turn {turn}: " + "item " * 40).final({"max_tokens": 4})
        traced = turn in (10, 50)
        if traced:
            lines.counts.clear()
            engine.run_on_thread(sys.settrace, lines)
            sys.settrace(lines)
        try:
            session.run(answer)
        finally:
            if traced:
                sys.settrace(None)
                engine.run_on_thread(sys.settrace, None)
        if traced:
            seen[turn] = dict(lines.counts)
        node = answer
    assert answer.result.stats.tokens_computed < 400  # its own ~230, not the path's
    early, late = (sum(seen[t].values()) for t in (10, 50))
    grown = sorted(((seen[50].get(k, 0) - seen[10].get(k, 0), k) for k in seen[50]),
                   reverse=True)[:5]
    # (4,600 -> 7,200 lines at turn 80 when each turn walked every node, block and turn end)
    assert late <= early * 1.15, grown
