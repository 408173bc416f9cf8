"""The baselines the benchmarks compare against are what they claim to be."""

from forkv.bench.rewind import run_rewind_bench


def test_rewind_baseline_recomputes_when_the_cache_has_wrapped():
    # gemma3's sliding-window caches rotate once the conversation outgrows the window: mlx-lm
    # cannot trim them back, so its baseline must be a recompute from scratch (not the new
    # prompt fed on top of the whole conversation).
    res = run_rewind_bench("demo:gemma3:tiny", quick=True)
    assert res["settings"]["baseline"].endswith("full recompute (the cache's trim does not land)")
    assert res["headline"]["exact"] is True


def test_rewind_baseline_trims_a_plain_kv_cache():
    res = run_rewind_bench("demo:qwen3:tiny", quick=True)
    assert res["settings"]["baseline"].endswith("prompt cache trimmed back to the prefix")
