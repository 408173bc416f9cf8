"""`forkv bench weights` runs every variant on both sides and reports them (never checks speed)."""

import json

import pytest

from forkv.bench import run_benchmark
from forkv.bench.weights import VARIANTS, run_weights_bench

KEYS = {"benchmark", "machine", "model", "settings", "cases", "headline", "targets", "notes"}


@pytest.fixture(scope="module")
def quick():
    return run_weights_bench("demo:gemma3:tiny", quick=True)


@pytest.mark.slow  # four variants loaded twice each, and a 4-bit folder made: ~15 s on 2 cores
def test_quick_run_measures_every_variant_on_both_sides(quick):
    json.dumps(quick)  # JSON-ready as it is
    assert KEYS <= set(quick) and quick["benchmark"] == "weights"
    assert quick["model"] == "demo:gemma3:tiny"
    assert [c["variant"] for c in quick["cases"]] == list(VARIANTS)
    assert quick["settings"]["skipped"] == []
    for case in quick["cases"]:
        for side in ("forkv", "mlx_lm"):
            load = case[side]
            assert load["load_s"] >= 0 and load["prefill_tps_median"] > 0
            assert load["decode_tps_median"] > 0 and len(load["runs"]) == 1
            kept = case["variant"] == "q4_kept"
            assert (load["quantized_layers"] > 0) == kept, (case["variant"], side)
        # checkpoints off: forkv computed every prompt token
        assert case["forkv"]["runs"][0]["computed_tokens"] == quick["settings"]["prompt_tokens"]
    from forkv.engine import native

    # kept: on forkv's CPU kernels where they are built, else on mlx's
    assert quick["cases"][2]["forkv"]["quantization"].endswith(
        native.kernel_label() or "kept"), quick["cases"][2]["forkv"]["quantization"]
    assert "dequantized to float32" in quick["cases"][3]["forkv"]["quantization"]


@pytest.mark.slow
def test_headline_has_every_figure(quick):
    h = quick["headline"]
    for name in ("dequantized_vs_float32_prefill", "dequantized_vs_float32_decode",
                 "dequantized_vs_kept_prefill", "dequantized_vs_kept_decode"):
        assert h[name] > 0
    for v in VARIANTS:
        for key in ("prefill_tps", "decode_tps"):
            assert h[f"{v}_{key}"] > 0 and h[f"mlx_lm_{v}_{key}"] > 0
            assert h[f"{v}_{key.removesuffix('_tps')}_vs_mlx_lm"] > 0
    assert set(quick["targets"]) == {"dequantized_vs_float32_prefill"}
    assert set(quick["targets"]["dequantized_vs_float32_prefill"]) == {"target", "met"}
    assert any("mlx-lm in this process uses it too" in n for n in quick["notes"])


@pytest.mark.slow
def test_the_4bit_folder_is_made_once_and_reused(quick):
    again = run_benchmark("weights", ["demo:gemma3:tiny"], quick=True,
                          settings=["variants=q4_dequantized"])
    assert again["settings"]["q4_folder"] == quick["settings"]["q4_folder"]
    assert any(n.startswith("4-bit folder") and "reused" in n for n in again["notes"])
    assert [c["variant"] for c in again["cases"]] == ["q4_dequantized"]
    assert again["headline"]["float32_prefill_tps"] is None  # not asked for: not measured
    assert again["headline"]["dequantized_vs_float32_prefill"] is None


def test_an_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown variant int8; choose from float32"):
        run_weights_bench("demo:gemma3:tiny", quick=True, variants=("int8",))
