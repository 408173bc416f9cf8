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
    early, late = range(7, 11), range(37, 41)  # (the least of each: a turn that records a
    for turn in range(1, 41):  # block, or starts one in a node's span, writes a few more)
        answer = node.user(f"Turn {turn}: " + "item " * 6).final({"max_tokens": 2})
        traced = turn in early or turn in late
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
    assert answer.result.stats.tokens_computed < 100  # its own ~40, not the path's
    first, last = (min(early, key=lambda t: sum(seen[t].values())),
                   min(late, key=lambda t: sum(seen[t].values())))
    grown = sorted(((seen[last].get(k, 0) - seen[first].get(k, 0), k) for k in seen[last]),
                   reverse=True)[:5]
    # (turn 10 -> 80 ran 4,619 -> 7,229 lines when each turn walked every node, block and
    # turn end)
    assert sum(seen[last].values()) <= sum(seen[first].values()) * 1.1, grown


def test_a_deep_responses_turn_runs_no_more_python_than_a_shallow_one():
    """The same through the Responses API (`previous_response_id` chain, exact reuse, another
    conversation in the tenant's tree): the request's tree work, keys and restore, on every
    thread the server runs them on."""
    import threading

    from forkv.server.app import ServerConfig, ServerState, make_app
    from starlette.testclient import TestClient

    lm = load_tiny("qwen3")
    config = ServerConfig(model="demo:qwen3:tiny", reasoning="off", reuse="exact")
    lines, seen, on = _Lines(), {}, [False]

    def tracer(frame, event, arg):  # (every thread the server starts: counts while `on`)
        return lines(frame, event, arg) if on[0] else None

    threading.settrace(tracer)
    try:
        with TestClient(make_app(ServerState(config, lm)),
                        base_url="http://127.0.0.1:8000") as client:
            def turn(text, prev):
                body = {"model": "demo:qwen3:tiny", "input": text, "max_output_tokens": 2,
                        "temperature": 0, "previous_response_id": prev}
                r = client.post("/v1/responses", json=body)
                assert r.status_code == 200, r.text
                return r.json()["id"]

            turn("Another conversation", None)
            prev = None
            for i in range(1, 41):
                traced = i in (10, 40)
                if traced:
                    lines.counts.clear()
                    on[0] = True
                    sys.settrace(tracer)
                try:
                    prev = turn(f"Question {i}: " + "word " * 6, prev)
                finally:
                    on[0] = False
                    sys.settrace(None)
                if traced:
                    seen[i] = dict(lines.counts)
    finally:
        threading.settrace(None)
    early, late = (sum(seen[t].values()) for t in (10, 40))
    grown = sorted(((seen[40].get(k, 0) - seen[10].get(k, 0), k) for k in seen[40]),
                   reverse=True)[:5]
    # (5,700 -> 9,000 lines at turn 60 when the tree work walked every node and turn end)
    assert late <= early * 1.15, grown
