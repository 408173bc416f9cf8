"""The one RAM budget (engine/cache/budget.py, issue 44 item 3): running requests' caches, the
live pool, the RAM tier and the feature cache share `EngineConfig.ram`; under pressure the pool
shrinks first, then records spill, then requests wait — and every request still completes
with the tokens an unconstrained engine gives."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from conftest import load_tiny
from forkv.engine import Engine, EngineConfig, EngineConfigError, SamplingParams
from forkv.engine.cache.budget import PARTS, Footprint, RamBudget, measure_footprint
from forkv.engine.cache.live import cache_nbytes
from forkv.engine.cache.recordstore import RecordStore
from helpers import MemoryDisk, random_tokens

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def _store():
    # a RAM tier whose own cap never binds here: only the budget makes it spill
    return RecordStore(1 << 30, MemoryDisk())


def _held(engine) -> dict[str, int]:
    """What the engine's parts hold now, measured on the arrays (not as counted)."""
    s = engine.scheduler
    running = sum(cache_nbytes(q.cache or []) for q in s.prefilling)
    running += cache_nbytes(s.batch.caches or [])
    job = engine.prefix.jobs.current
    if job is not None:
        running += cache_nbytes(job.seq.cache or [])
    pool = engine.prefix.live.nbytes if engine.prefix.live is not None else 0
    return {"running": running, "pool": pool, "records": engine.store.ram.nbytes}


def _run_by_hand(engine, prompts, params=GREEDY):
    """Submit every prompt at once and step until done; the results, the most requests that
    ran together, and the largest sum the parts held after any step."""
    most, peak = 0, 0
    with engine.paused():
        handles = [engine.submit(p, params) for p in prompts]
        while not all(h.done for h in handles):
            engine.step_once()
            s = engine.scheduler
            most = max(most, len(s.prefilling) + len(s.rows))
            peak = max(peak, sum(engine.run_on_thread(_held, engine).values()))
    return [h.result() for h in handles], most, peak


# -- settings --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["lots", "-1GiB", 0, "0", True, "2 GB x"])
def test_bad_values_name_the_field(bad):
    with pytest.raises(EngineConfigError, match="ram"):
        EngineConfig.from_env(ram=bad)


def test_sizes_off_and_the_environment():
    assert EngineConfig.from_env().ram == 2 << 30
    assert EngineConfig.from_env(ram="512MiB").ram == 512 << 20
    assert EngineConfig.from_env(ram="1GB").ram == 10**9
    assert EngineConfig.from_env(ram=4096).ram == 4096
    assert EngineConfig.from_env(ram="off").ram is None
    assert EngineConfig.from_env({"FORKV_RAM": "3GiB"}).ram == 3 << 30
    with pytest.raises(EngineConfigError, match="FORKV_RAM"):
        EngineConfig.from_env({"FORKV_RAM": "plenty"})


# -- the footprint ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen3_5"])
def test_footprint_bounds_what_a_request_holds(arch):
    """A request's caches at n tokens never hold more than its footprint says (global layers
    grow by 256-token steps, rings stop at their window, recurrent state is fixed)."""
    lm = load_tiny(arch)
    fp = measure_footprint(lm, 256)
    with Engine(lm, store=_store(), ram="off") as engine:
        for n, new in [(300, 20), (700, 40)]:
            tokens = random_tokens(n, seed=n)
            held = engine.run_on_thread(_prompt_cache_bytes, engine, tokens, new)
            assert 0 < held <= fp.bytes_at(n + new)
            assert fp.bytes_at(n + new) <= 4 * held  # and not wildly above it


def _prompt_cache_bytes(engine, tokens, new):
    from forkv.engine.request.generate import prefill

    cache = engine.lm.make_cache()
    prefill(engine.lm.model, cache, tokens + random_tokens(new, seed=1), 0, 256)
    return cache_nbytes(cache)


# -- the pressure order ----------------------------------------------------------------------
class _Part:
    def __init__(self, name, nbytes, log):
        self.name, self.nbytes, self.log = name, nbytes, log

    def shrink_to(self, limit):
        self.log.append((self.name, self.nbytes, limit))
        self.nbytes = min(self.nbytes, limit)


def test_pressure_shrinks_the_pool_then_records_then_features():
    log = []
    budget = RamBudget(1000, Footprint(((1, None),)))
    for name, n in zip(PARTS, (300, 300, 300)):
        budget.attach(name, _Part(name, n, log))
    budget.running = 50
    budget.settle()
    assert log == []  # 950 fits
    budget.running = 250  # 1150: the pool gives 150
    budget.settle()
    assert log == [("pool", 300, 150)]
    budget.running = 600  # 1350: the pool gives its last 150, records 200
    budget.settle()
    assert log[1:] == [("pool", 150, 0), ("records", 300, 100)]
    budget.running = 900  # 1300: records give their last 100, then the features 200
    budget.settle()
    assert log[3:] == [("records", 100, 0), ("features", 300, 100)]
    assert budget.used() == {"running": 900, "pool": 0, "records": 0, "features": 100}
    assert budget.stats.freed == {"pool": 300, "records": 300, "features": 200}


def test_the_pool_empties_before_any_record_spills():
    """On an engine: every record the budget spills leaves RAM while the pool holds nothing."""
    lm = load_tiny("qwen3")
    fp = measure_footprint(lm, 256)
    prompts = [random_tokens(520 + 40 * i, seed=10 + i) for i in range(4)]
    ram = 6 * fp.bytes_at(700 + 12)
    with Engine(lm, store=_store(), ram=ram, reuse="fast") as engine:
        pool_at_spill = []
        spill = engine.store.ram.spill

        def watch(key, record):
            pool_at_spill.append(engine.prefix.live.nbytes)
            spill(key, record)

        engine.store.ram.spill = watch
        for p in prompts:  # one at a time: the pool and the RAM tier fill up
            engine.generate(p, GREEDY)
        assert engine.prefix.live.nbytes > 0 and engine.store.ram.nbytes > 0
        # five at once: their caches claim the pool's room, then some of the records'
        _run_by_hand(engine, [random_tokens(700, seed=30 + i) for i in range(5)])
        st = engine.budget.as_dict()
        assert st["freed"]["pool"] > 0 and st["freed"]["records"] > 0
        assert pool_at_spill and set(pool_at_spill) == {0}


# -- requests wait, and complete exactly -----------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_a_burst_waits_within_the_budget_and_matches_an_unconstrained_engine(arch):
    lm = load_tiny(arch)
    prompts = [random_tokens(260 + 97 * i, seed=i) for i in range(6)]
    with Engine(lm, store=_store(), ram="off") as free:
        want, most_free, _ = _run_by_hand(free, prompts)
    assert most_free == len(prompts)  # unconstrained, all of them run together
    fp = measure_footprint(lm, 256)
    ram = 2 * fp.bytes_at(max(map(len, prompts)) + GREEDY.max_tokens) + 1
    with Engine(lm, store=_store(), ram=ram) as tight:
        got, most, peak = _run_by_hand(tight, prompts)
        st = tight.budget.as_dict()
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.text for r in got] == [r.text for r in want]
    for a, b in zip(got, want):  # other batch widths: rounding only, as test_batch allows
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    assert [r.finish_reason for r in got] == ["length"] * len(prompts)
    assert 1 <= most <= 2 and st["waits"] >= 1 and st["over_budget"] == 0
    assert peak <= ram  # what the parts held, measured, never passed the budget
    assert st["budget"] == ram and st["running"] == 0  # all done: nothing counted as running


def test_a_request_bigger_than_the_budget_runs_alone(caplog):
    lm = load_tiny("qwen3")
    prompts = [random_tokens(600, seed=40 + i) for i in range(3)]
    with Engine(lm, store=_store(), ram="off") as free:
        want = [free.generate(p, GREEDY) for p in prompts]
    with caplog.at_level(logging.WARNING, logger="forkv.engine.cache.budget"), \
            Engine(lm, store=_store(), ram="256KiB") as tiny:
        tiny.generate(random_tokens(10, seed=1), GREEDY)  # fits: its caches give the footprint
        assert tiny.budget.as_dict()["over_budget"] == 0
        got, most, _ = _run_by_hand(tiny, prompts)
        st = tiny.budget.as_dict()
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert most == 1 and st["over_budget"] == len(prompts)
    assert "--ram" in caplog.text and "runs alone" in caplog.text


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_5"])
def test_the_footprint_is_measured_as_the_engine_starts(arch):
    lm = load_tiny(arch)
    with Engine(lm, store=_store(), ram="1GiB") as engine:
        assert engine.budget.footprint == measure_footprint(lm, 256)


def test_without_a_probe_the_first_request_gives_the_footprint(monkeypatch):
    """Where the probe fails, a first chunk shows what a request's caches hold; until then a
    second request waits for it."""
    import forkv.engine.engine as engine_module

    def fail(*a, **kw):
        raise RuntimeError("no probe")

    monkeypatch.setattr(engine_module, "measure_footprint", fail)
    lm = load_tiny("gemma3")
    with Engine(lm, store=_store(), ram="1GiB") as engine:
        assert engine.budget.footprint is None
        _, most, _ = _run_by_hand(engine, [random_tokens(300, seed=2), random_tokens(9, seed=3)])
        assert engine.budget.footprint == measure_footprint(lm, 256)
        assert most == 2 and engine.budget.as_dict()["waits"] == 0  # (not a wait for room)


def test_stats_show_the_split():
    lm = load_tiny("qwen3")
    with Engine(lm, store=RecordStore(1 << 30, None), ram="256MiB", reuse="fast") as engine:
        engine.generate(random_tokens(600, seed=3), GREEDY)
        st = engine.stats()["ram_budget"]
    assert st["budget"] == 256 << 20 and st["pool"] > 0 and st["records"] > 0
    assert st["used"] == st["running"] + st["pool"] + st["records"] + st["features"]


# -- the front doors -------------------------------------------------------------------------
def test_metrics_show_the_budget_and_its_parts():
    from forkv.server.metrics import Metrics
    from forkv.server.served_engine import ServedEngine

    lm = load_tiny("qwen3")
    engine = Engine(lm, store=RecordStore(1 << 30, None), ram="1GiB", reuse="fast")
    served = ServedEngine(lm, engine=engine)
    try:
        served.engine.generate(random_tokens(600, seed=5), GREEDY)
        text = Metrics().render(served.stats())
    finally:
        served.close()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines["forkv_ram_budget_bytes"]) == 1 << 30
    parts = {k.split('"')[1]: float(v) for k, v in lines.items()
             if k.startswith("forkv_ram_bytes{")}
    assert set(parts) == {"running", "pool", "records", "features"}
    assert parts["pool"] > 0 and parts["records"] > 0
    assert "forkv_ram_waits_total" in lines


def test_cli_ram_option(capsys):
    from forkv.cli import main

    assert main(["generate", "x", "--model", "demo:qwen3:tiny", "--ram", "lots"]) == 2
    err = capsys.readouterr().err
    assert "ram='lots'" in err and err.count("\n") == 1
    assert main(["generate", "x", "--model", "demo:qwen3:tiny", "--max-tokens", "3",
                 "--ram", "8MiB"]) == 0


def test_a_vision_models_features_give_way_last():
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (pip install 'forkv[vision]')")
    from test_vision import ask, image, vlm

    lm = vlm()
    prompt, img = ask("What is it?"), image(1)
    with Engine(lm, block_size=32, store=RecordStore(1 << 30, None), ram="1GiB") as eng:
        first = eng.generate(prompt, GREEDY, images=[img])
        budget = eng.budget
        used = budget.used()
        assert used["features"] == eng.vision.features.nbytes > 0 and used["records"] > 0
        budget.total = used["running"] + used["features"]  # no room left but the features'
        eng.run_on_thread(budget.settle)
        assert budget.used() == {**used, "pool": 0, "records": 0}
        budget.total -= 1  # and then not even theirs
        eng.run_on_thread(budget.settle)
        assert budget.used()["features"] == 0 and eng.vision.features.stats.evictions == 1
        budget.total = 1 << 30
        again = eng.generate(prompt, GREEDY, images=[img])  # the tower runs again: same tokens
        assert again.token_ids == first.token_ids
        assert eng.vision.features.stats.tower_runs == 2


@pytest.mark.slow
def test_the_burst_benchmark_runs_each_setting_in_its_own_process():
    from forkv.bench.ram_burst import run

    rows = run("demo:qwen3:tiny", ["off", "64KiB"], n=3, length=300, max_tokens=8)
    assert [r["ram"] for r in rows] == ["off", "64KiB"]
    assert rows[0]["tokens_sha256"] == rows[1]["tokens_sha256"]  # the budget changed no token
    assert rows[0]["waits"] == 0 and rows[1]["waits"] >= 1
    assert all(r["peak_rss_mib"] >= r["rss_after_load_mib"] > 0 for r in rows)


def test_a_store_of_the_callers_own_without_a_ram_tier_is_taken():
    # `Engine(store=...)` takes any RecordStore-like object (`forkv bench store` passes one
    # that keeps plain files): the budget has no records part to attach then.
    from forkv.bench.store import _PlainFilesStore

    lm = load_tiny("qwen3")
    eng = Engine(lm, store=_PlainFilesStore(32))
    try:
        assert eng.generate(random_tokens(40), max_tokens=3).token_ids
    finally:
        eng.close()
