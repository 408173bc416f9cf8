"""forkv.remote against real servers on loopback: three `forkv serve` replicas (affinity,
stats, failover when one is killed mid-workflow) and mlx-lm's own `mlx_lm.server`.

Every server is started by a fixture and stopped by its finalizer (also on failure).
"""

import forkv
import pytest
from forkv.bench.cluster import SYSTEM, branch_and_prune, document, start_replica
from forkv.bench.serve_procs import start_peer
from forkv.remote import remote
from forkv.remote.wire import route_key

MODEL = "demo:qwen3:tiny"
pytestmark = pytest.mark.slow  # starts server processes (~30 s on 2 cores)


@pytest.fixture(scope="module")
def replicas():
    procs = [start_replica(MODEL) for _ in range(3)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def owner_of(backend, doc):
    key = route_key([{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Read this contract:\n" + doc}],
                    backend.cache_salt)
    return backend.router.order(key)[0].url


def test_one_tree_stays_on_one_replica_and_reuses_its_prefix(replicas):
    doc = document(1, 12)
    with remote([p.base_url for p in replicas], model=MODEL, cache_salt="affinity") as backend:
        with forkv.Session(backend) as session:
            texts = branch_and_prune(session, doc)
            nodes = [n for n in session.tree if n.result is not None]
        stats = backend.stats()
    assert len(texts) == 6 and all(isinstance(t, str) for t in texts)
    used = {url: r["requests"] for url, r in stats["replicas"].items() if r["requests"]}
    assert list(used) == [owner_of(backend, doc)] and stats["requests"] == 6
    prompts = [n.result.stats.tokens_reused + n.result.stats.tokens_computed for n in nodes]
    assert min(prompts) > 256  # the document is more than one block
    reused = sorted(n.result.stats.tokens_reused for n in nodes)
    assert reused[0] == 0 and all(r >= 256 for r in reused[1:])  # only the first computes it
    assert stats["cached_tokens"] == sum(reused) and stats["failovers"] == 0


def test_round_robin_spreads_one_tree_and_loses_reuse(replicas):
    doc = document(2, 12)
    with remote([p.base_url for p in replicas], model=MODEL, routing="round_robin",
                cache_salt="rr") as backend:
        with forkv.Session(backend) as session:
            branch_and_prune(session, doc)
        stats = backend.stats()
    assert sum(1 for r in stats["replicas"].values() if r["requests"]) == 3
    assert stats["cached_tokens"] < stats["prompt_tokens"] / 2


def test_cache_salt_keeps_tenants_apart(replicas):
    url = replicas[0].base_url
    doc = document(3, 12)
    reused = []
    for salt in ("tenant-a", "tenant-b", "tenant-a"):  # b finds nothing of a; a finds its own
        with remote(url, model=MODEL, cache_salt=salt) as backend:
            handle = backend.submit([{"role": "user", "content": doc}], max_tokens=2)
            reused.append(handle.result(timeout=120).timings.reused_tokens)
    assert reused[0] == reused[1] == 0 and reused[2] >= 256


def test_killing_the_replica_mid_workflow_keeps_the_outputs(replicas):
    """Branch-and-prune at temperature 0 (branches seeded) on one replica alone, then on all
    three while the replica holding the tree is killed in the middle of its reasoning: the
    stream resumes on the next replica and every node's text is the same. Runs last: it
    leaves one replica dead."""
    doc = document(4, 12)
    with remote(replicas[0].base_url, model=MODEL, cache_salt="single") as one, \
            forkv.Session(one) as session:
        expected = branch_and_prune(session, doc)
    with remote([p.base_url for p in replicas], model=MODEL, cache_salt="failover") as backend:
        victim = next(p for p in replicas if p.base_url == owner_of(backend, doc))
        seen = []

        def kill_mid_reasoning(event):
            seen.append(event)
            if len(seen) == 4:
                assert event.kind == "reasoning" and not event.is_last
                victim.proc.kill()
                victim.proc.wait()

        with forkv.Session(backend) as session:
            got = branch_and_prune(session, doc, kill_mid_reasoning)
        stats = backend.stats()
    assert got == expected
    assert stats["failovers"] >= 1 and stats["replicas"][victim.base_url]["failures"] >= 1


def test_mlx_lm_server_runs_the_same_graph():
    from forkv.engine.models.loader import resolve_model_path

    peer = start_peer(str(resolve_model_path(MODEL)), "float32")
    try:
        peer.wait_ready()
        with remote(peer.base_url, model=peer.model, tokenizer=MODEL) as backend, \
                forkv.Session(backend) as session:
            texts = branch_and_prune(session, document(5, 12))
            done = [n for n in session.tree if n.result is not None]
    finally:
        peer.stop()
    assert len(texts) == 6 and len(done) == 6
    assert all(n.result.stats.tokens_generated > 0 for n in done)
