"""`forkv bench cluster`: conversation graphs over 3 `forkv serve` replicas through
`forkv.remote`, prefix-affinity routing against round robin.

Starts its own servers (and stops them): three `forkv serve` replicas of one model, then
`mlx_lm.server` on the same model folder. Workloads: branch-and-prune (think, answer, prune,
follow up, fork three answers) and tree-of-thought (four sampled thoughts, then an answer after
the first), one tree per document, all trees at once. Each routing mode runs with its own
`cache_salt` (its own namespaces on the servers), so neither inherits the other's caches.
Headline: `affinity_gain` (wall time round robin / affinity), `cached_ratio_*` (cached / prompt
tokens), `failover_ok` (a replica killed mid-workflow: same outputs as one replica alone, at
temperature 0), `peer_server_ok` (the graph ran on mlx_lm.server), `vllm_ok` (the graph ran on
two vLLM replicas with cached tokens on every node after the first; None without vLLM's
environment, see `cluster_vllm`).
"""

from __future__ import annotations

import sys
import threading
import time

from .cluster_vllm import vllm_graph_ok, vllm_python
from .common import result
from .serve_procs import ServerProcess, _free_port, start_peer

__all__ = ["branch_and_prune", "run_cluster_bench", "start_replica", "tree_of_thought"]

SYSTEM = "You review documents for a legal team. Quote the clause before you comment."


def document(i: int, n_lines: int) -> str:
    return "".join(f"Clause {i}.{k}: the supplier shall deliver part {k * 7 + i} within "
                   f"{k + i} days of the order, or pay a penalty of {k * 3} percent.\n"
                   for k in range(n_lines))


def start_replica(model: str, *extra: str) -> ServerProcess:
    """One `forkv serve` process on a free loopback port (call wait_ready, then stop)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "forkv.cli", "serve", "--model", model, "--port", str(port),
           "--reasoning", "off", *extra]
    return ServerProcess("forkv serve", cmd, port, model)


def branch_and_prune(session, doc: str, on_event=None, think: int = 24,
                     answer: int = 12) -> list[str]:
    """Think, answer, prune the thinking, follow up, fork three answers; the node texts.
    `on_event(event)` sees every streamed node event (a test kills a replica from it)."""
    def run(targets):
        for event in session.stream(targets):
            if on_event is not None:
                on_event(event)

    user = session.system(SYSTEM).user("Read this contract:\n" + doc)
    reasoning = user.reasoning({"max_tokens": think, "temperature": 0.0})
    final = reasoning.final({"max_tokens": answer})
    run(final)
    kept = session.tree.prune(final)
    follow = kept.user("Which clause is the riskiest?").final({"max_tokens": answer})
    run(follow)
    branches = user.fork(3, gen={"max_tokens": answer, "temperature": 0.7})
    run(branches)
    return [n.text for n in (reasoning, final, follow, *branches)]


def tree_of_thought(session, doc: str, answer: int = 12) -> list[str]:
    """Four sampled thoughts about one question, then an answer after the first one."""
    user = session.system(SYSTEM).user("Summarise the penalties:\n" + doc)
    branches = user.fork(4, gen={"max_tokens": answer, "temperature": 0.8})
    session.run(branches)
    best = branches[0].final({"max_tokens": answer})
    session.run(best)
    return [n.text for n in (*branches, best)]


def _tokens(session) -> tuple[int, int]:
    prompt = cached = 0
    for node in session.tree:
        if node.result is not None and node.result.stats is not None:
            s = node.result.stats
            prompt += s.tokens_reused + s.tokens_computed
            cached += s.tokens_reused
    return prompt, cached


def _run_mode(urls, model, routing, docs) -> dict:
    import forkv
    from forkv.remote import remote

    backend = remote(urls, model=model, routing=routing, cache_salt=f"bench-{routing}")
    totals = {"prompt": 0, "cached": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int, doc: str) -> None:
        try:
            with forkv.Session(backend) as session:
                (branch_and_prune if i % 2 == 0 else tree_of_thought)(session, doc)
                prompt, cached = _tokens(session)
            with lock:
                totals["prompt"] += prompt
                totals["cached"] += cached
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(docs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    backend.close()
    if errors:
        raise errors[0]
    return {"routing": routing, "wall_s": round(wall, 3), "prompt_tokens": totals["prompt"],
            "cached_tokens": totals["cached"],
            "cached_ratio": round(totals["cached"] / max(1, totals["prompt"]), 4)}


def failover_matches(replicas: list[ServerProcess], model: str, doc: str) -> bool:
    """Run branch-and-prune on one replica alone, then on all of them while killing the one
    that holds the tree in the middle of its reasoning; True if every output matches."""
    import forkv
    from forkv.remote import remote
    from forkv.remote.wire import route_key

    urls = [r.base_url for r in replicas]
    with remote(urls[:1], model=model, cache_salt="single") as one, forkv.Session(one) as session:
        expected = branch_and_prune(session, doc)
    backend = remote(urls, model=model, cache_salt="failover")
    key = route_key([{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Read this contract:\n" + doc}],
                    backend.cache_salt)
    owner = backend.router.order(key)[0].url
    victim = next(r for r in replicas if r.base_url == owner)
    seen = {"n": 0}

    def kill_mid_reasoning(event) -> None:
        seen["n"] += 1
        if seen["n"] == 4 and victim.proc.poll() is None:
            victim.proc.kill()

    try:
        with forkv.Session(backend) as session:
            got = branch_and_prune(session, doc, kill_mid_reasoning)
        return got == expected and backend.stats()["failovers"] >= 1
    finally:
        backend.close()


def run_cluster_bench(model: str = "demo:qwen3:tiny", quick: bool = False,
                      reps: int | None = None, trees: int = 0, vllm: str = "auto") -> dict:
    """`vllm`: "auto" runs the vLLM replicas when vLLM's environment exists and the run is not
    --quick (they take minutes to start), "on" always, "off" never."""
    from forkv.engine.models.loader import resolve_model_path

    if vllm not in ("auto", "on", "off"):
        raise ValueError(f"vllm must be auto, on or off, got {vllm!r}.")
    trees = trees or (4 if quick else 12)
    docs = [document(i, 12 if quick else 40) for i in range(trees)]
    replicas = [start_replica(model) for _ in range(3)]
    cases, notes = [], []
    try:
        for r in replicas:
            r.wait_ready()
        urls = [r.base_url for r in replicas]
        # Round robin first: a warm-up of the servers then favours it, not us.
        rr = _run_mode(urls, model, "round_robin", docs)
        aff = _run_mode(urls, model, "affinity", docs)
        cases += [rr, aff]
        failover_ok = failover_matches(replicas, model, document(99, 12))
    finally:
        for r in replicas:
            r.stop()
    peer = start_peer(str(resolve_model_path(model)), "float32")
    try:
        peer.wait_ready()
        peer_ok = _peer_runs(peer, model)
    except Exception as e:  # noqa: BLE001 - reported as not ok
        peer_ok = False
        notes.append(f"mlx_lm.server run failed: {type(e).__name__}: {e}")
    finally:
        peer.stop()
    vllm_ok, python = None, vllm_python()
    if vllm == "off" or (vllm == "auto" and quick):
        notes.append("vllm_ok is null: vLLM not started (--quick or vllm=off; --set vllm=on "
                     "starts it; tests/test_remote_vllm.py runs it).")
    elif python is None:
        notes.append("vllm_ok is null: no .venv-vllm (or FORKV_VLLM_PYTHON) with vLLM's CPU build; "
                     ".ci/run makes one.")
    else:
        try:
            vllm_ok, reused = vllm_graph_ok(python, document(8, 12))
            cases.append({"routing": "affinity", "server": "vllm", "tokens_reused": reused})
        except Exception as e:  # noqa: BLE001 - reported as not ok
            vllm_ok = False
            notes.append(f"vLLM run failed: {type(e).__name__}: {e}"[:2000])
    headline = {"affinity_gain": round(rr["wall_s"] / max(aff["wall_s"], 1e-9), 3),
                "cached_ratio_affinity": aff["cached_ratio"],
                "cached_ratio_round_robin": rr["cached_ratio"],
                "failover_ok": failover_ok, "peer_server_ok": peer_ok, "vllm_ok": vllm_ok}
    targets = {"affinity_gain": ">= 1.5", "failover_ok": "== true", "peer_server_ok": "== true"}
    return result("cluster", model, {"replicas": 3, "trees": trees, "quick": quick}, cases,
                  headline, targets, notes)


def _peer_runs(peer: ServerProcess, model: str) -> bool:
    import forkv
    from forkv.remote import remote

    with remote(peer.base_url, model=peer.model, tokenizer=model) as backend, \
            forkv.Session(backend) as session:
        texts = branch_and_prune(session, document(7, 12))
    return len(texts) == 6
