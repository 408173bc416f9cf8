"""Every benchmark runs in --quick mode and writes well-formed JSON (never checks speed)."""

import json
import subprocess
import sys

import pytest

from forkv.bench import BENCHMARKS, available

KEYS = {"benchmark", "machine", "model", "settings", "cases", "headline", "targets", "notes"}
HEADLINES = {
    "rewind": {"speedup_8k", "exact"}, "agent": {"speedup", "prefill_ratio", "tot_speedup"},
    "parallel": {"throughput_ratio", "vs_mlx_lm_batched", "roofline_fraction"},
    "memory": {"extra_ram_reduction"},
    "image": {"repeat_speedup"}, "store": {"encryption_overhead", "aead_gbps"},
    "blas": {"prefill_speedup"}, "constrained": {"overhead_percent", "schema_held"},
    "serve": {"extend_ttft_ratio", "ttft_speedup_fork", "ttft_speedup_rewind",
              "concurrent_throughput_ratio"},
    "cluster": {"affinity_gain", "cached_ratio_affinity", "cached_ratio_round_robin",
                "failover_ok", "peer_server_ok", "vllm_ok"},
    "weights": {"dequantized_vs_float32_prefill", "dequantized_vs_kept_prefill",
                "q4_dequantized_prefill_vs_mlx_lm"},
    "restore": {"restore_vs_read", "read_ms", "build_ms", "restore_ms"},
    "kv": {"float16_ppl_vs_float32", "bfloat16_ppl_vs_float32", "float16_decode_vs_float32"},
    "contention": {"quiet_s", "slowdown_busy2"},
    "depth": {"depth_ratio", "overhead_depth_ratio", "turn_10_ms"},
    "decode": {"edit_vs_off", "chat_spec_vs_off", "spec_identical", "llamacpp_ok"},
}


def test_every_benchmark_has_a_headline_spec():
    assert set(BENCHMARKS) == set(HEADLINES)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "all", "--quick",
                        "--report", str(out), "--json", str(out / "all.json")],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow  # `bench all --quick`: every benchmark end to end (servers and cluster
# included), 10 minutes on 2 busy cores
@pytest.mark.parametrize("name", available())
def test_quick_benchmark_json_is_well_formed(report, name):
    data = json.loads((report / f"{name}.json").read_text())
    assert KEYS <= set(data)
    assert data["benchmark"] == name and data["cases"]
    assert HEADLINES[name] <= set(data["headline"])
    machine = data["machine"]
    assert {"cpu", "cores", "ram_gib", "os", "mlx", "mlx_lm", "blas", "dtype"} <= set(machine)
    for target in data["targets"].values():
        assert set(target) == {"target", "met"}


@pytest.mark.slow
def test_report_has_summary_and_plots(report):
    summary = (report / "summary.md").read_text()
    assert "| benchmark |" in summary and "Machine:" in summary
    assert json.loads((report / "all.json").read_text()).keys() == set(available())
    if "rewind" in available():
        assert (report / "rewind.png").stat().st_size > 1000


def test_unknown_benchmark_is_a_clear_error():
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Unknown benchmark 'nope'" in r.stderr
