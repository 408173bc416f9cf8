"""`run_agent_bench(quick=True)`: both workflows, forkv vs plain mlx-lm and vs the replay on
forkv's kernels, on a tiny model."""

from forkv.bench.agent import QUICK, run_agent_bench
from forkv.bench.agent_baseline import load_plain_model


def test_quick_agent_bench_reports_every_side():
    r = run_agent_bench("demo:gemma3:tiny", quick=True, reps=1)
    assert r["benchmark"] == "agent" and r["model"] == "demo:gemma3:tiny"
    assert set(r["headline"]) == {"speedup", "prefill_ratio", "turn_speedup",
                                  "turn_ttft_speedup", "tot_speedup", "tot_prefill_ratio",
                                  "reuse_turn_speedup", "reuse_turn_ttft_speedup",
                                  "reuse_tot_speedup"}
    for key in ("turn_speedup", "turn_ttft_speedup", "reuse_turn_speedup",
                "reuse_turn_ttft_speedup"):  # QUICK has 2 turns: one after a prune
        assert r["headline"][key] > 0
    # targets: per turn after a prune, vs plain mlx-lm; the whole-workflow speedup and the
    # reuse-alone figures are reported only
    assert set(r["targets"]) == {"turn_speedup", "turn_ttft_speedup", "tot_speedup"}
    assert r["targets"]["turn_ttft_speedup"]["target"] == ">= 20"
    assert r["settings"]["speculate"] == "off"
    assert r["settings"]["mlx_lm_model"] == "mlx_lm.load"  # float32 demo weights, as saved
    assert any("mlx_lm.load" in n for n in r["notes"]) and any("reuse alone" in n
                                                               for n in r["notes"])
    bp, tot = r["cases"]
    assert [bp["workflow"], tot["workflow"]] == ["branch_prune", "tree_of_thought"]
    assert r["headline"]["reuse_tot_speedup"] == tot["reuse_speedup"]
    for case in (bp, tot):
        ours, plain, kernels = case["forkv"], case["mlx_lm"], case["no_reuse"]
        for base in (plain, kernels):
            assert ours["wall_s"]["median"] > 0 and base["wall_s"]["median"] > 0
            # each baseline replays forkv's prompts and generated tokens, step by step
            assert [s["generated"] for s in ours["steps"]] == [s["generated"]
                                                               for s in base["steps"]]
            for s in ours["steps"] + base["steps"]:  # the first token comes within the step
                assert 0 < s["ttft_s"] <= s["wall_s"] + 1e-3
            assert 0 < ours["prefill_tokens"] < base["prefill_tokens"]
        # the two baselines differ in the model only: the same cache moves, the same prefill
        assert [s["cache"] for s in plain["steps"]] == [s["cache"] for s in kernels["steps"]]
        assert plain["prefill_tokens"] == kernels["prefill_tokens"]
        assert case["prefill_ratio"] == case["reuse_prefill_ratio"] > 1
    assert len(bp["forkv"]["steps"]) == 2 * QUICK.turns
    assert len(tot["forkv"]["steps"]) == QUICK.tot_k + 1
    # every branch after the first restores the shared prompt's full blocks
    assert all(s["reused"] > 0 for s in tot["forkv"]["steps"][1:])
    assert [s["cache"] for s in tot["mlx_lm"]["steps"][:2]] == ["recompute", "recompute"]
    # an answer right after its reasoning extends the baseline's cache, as with a real model
    assert [s["cache"] for s in bp["mlx_lm"]["steps"]][:2] == ["recompute", "extend"]


def test_the_headline_baseline_runs_on_mlx_own_ops():
    from forkv.engine import load_model

    lm = load_model("demo:gemma3:tiny")
    plain, how = load_plain_model(lm)
    assert how == "mlx_lm.load"
    ours = dict(lm.model.named_modules())
    theirs = dict(plain.named_modules())
    assert ours.keys() == theirs.keys()
    # forkv's loader moves attention (and more) onto its kernels; the baseline's stay mlx's
    assert any("_forkv_lib" in vars(m) for m in ours.values())
    assert not any("_forkv_lib" in vars(m) for m in theirs.values())
    moved = [k for k in ours if type(ours[k]) is not type(theirs[k])]
    assert moved and all(issubclass(type(ours[k]), type(theirs[k])) for k in moved)
    assert all(type(m).__module__.startswith(("mlx.", "mlx_lm.")) for m in theirs.values())
