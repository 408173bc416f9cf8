"""`run_agent_bench(quick=True)`: both workflows, forkv vs the mlx-lm baseline, on a tiny model."""

from forkv.bench.agent import QUICK, run_agent_bench


def test_quick_agent_bench_reports_both_sides():
    r = run_agent_bench("demo:gemma3:tiny", quick=True, reps=1)
    assert r["benchmark"] == "agent" and r["model"] == "demo:gemma3:tiny"
    assert set(r["headline"]) == {"speedup", "prefill_ratio", "turn_speedup",
                                  "turn_ttft_speedup", "tot_speedup", "tot_prefill_ratio"}
    assert r["headline"]["turn_speedup"] > 0  # QUICK has 2 turns: one after a prune
    assert r["headline"]["turn_ttft_speedup"] > 0
    # targets: per turn after a prune; the whole-workflow speedup is reported only
    assert set(r["targets"]) == {"turn_speedup", "turn_ttft_speedup", "tot_speedup"}
    assert r["targets"]["turn_ttft_speedup"]["target"] == ">= 20"
    bp, tot = r["cases"]
    assert [bp["workflow"], tot["workflow"]] == ["branch_prune", "tree_of_thought"]
    for case in (bp, tot):
        ours, base = case["forkv"], case["mlx_lm"]
        assert ours["wall_s"]["median"] > 0 and base["wall_s"]["median"] > 0
        # the baseline replays forkv's prompts and generated tokens, step by step
        assert [s["generated"] for s in ours["steps"]] == [s["generated"] for s in base["steps"]]
        for s in ours["steps"] + base["steps"]:  # the first token comes within the step
            assert 0 < s["ttft_s"] <= s["wall_s"] + 1e-3
        assert 0 < ours["prefill_tokens"] < base["prefill_tokens"]
        assert case["prefill_ratio"] > 1
    assert len(bp["forkv"]["steps"]) == 2 * QUICK.turns
    assert len(tot["forkv"]["steps"]) == QUICK.tot_k + 1
    # every branch after the first restores the shared prompt's full blocks
    assert all(s["reused"] > 0 for s in tot["forkv"]["steps"][1:])
    assert [s["cache"] for s in tot["mlx_lm"]["steps"][:2]] == ["recompute", "recompute"]
    # an answer right after its reasoning extends the baseline's cache, as with a real model
    assert [s["cache"] for s in bp["mlx_lm"]["steps"]][:2] == ["recompute", "extend"]
