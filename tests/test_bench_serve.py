"""`forkv bench serve`'s parts that need no server: the vLLM view of a model folder, the
headline figures against each peer, peak RSS over a process tree, setting checks."""

import json
import os
import signal
import sys
import time

import pytest
from forkv.bench import cluster_vllm
from forkv.bench.serve import QUICK, _result, run_serve_bench
from forkv.bench.serve_procs import ServerProcess, _children


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _folder(root, config: dict):
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_vllm_view_names_the_architecture_and_links_the_files(cache):
    folder = _folder(cache, {"model_type": "gemma3_text", "hidden_size": 8})
    view = cluster_vllm.vllm_view(folder)
    assert view != folder and view.parent.name == "demo"
    config = json.loads((view / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["hidden_size"] == 8
    assert (view / "model.safetensors").read_bytes() == b"weights"
    assert (view / "model.safetensors").is_symlink()  # weights are not copied
    assert "architectures" not in json.loads((folder / "config.json").read_text())
    assert cluster_vllm.vllm_view(folder) == view  # again: same view, no error


def test_vllm_views_of_two_folders_with_one_name_are_apart(cache):
    a = _folder(cache, {"model_type": "qwen3"})
    (cache / "other").mkdir()
    b = _folder(cache / "other", {"model_type": "llama"})
    va, vb = cluster_vllm.vllm_view(a), cluster_vllm.vllm_view(b)
    assert va != vb
    assert json.loads((vb / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (vb / "model.safetensors").resolve() == (b / "model.safetensors").resolve()


def test_vllm_view_keeps_a_folder_that_names_its_class(cache):
    folder = _folder(cache, {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    assert cluster_vllm.vllm_view(folder) == folder


def test_vllm_view_refuses_an_unknown_type_by_name(cache):
    folder = _folder(cache, {"model_type": "qwen3_5"})
    with pytest.raises(ValueError, match="model_type 'qwen3_5'"):
        cluster_vllm.vllm_view(folder)


def _side(ttft: float, rewind: float, tps: float, rss: float) -> dict:
    return {"extend": {"later_ttft_s": ttft}, "rewind": {"rewind_ttft_s": rewind},
            "concurrent": {"tokens_per_s": tps}, "peak_rss_mib": rss}


def test_headline_has_each_peer_and_targets_only_for_mlx_lm():
    sides = {"forkv": [_side(1.0, 1.0, 30.0, 900)], "peer": [_side(1.1, 5.0, 20.0, 1800)],
             "vllm": [_side(0.5, 2.0, 60.0, 6000)]}
    res = _result("demo:x", QUICK, 1, "float32", sides, ("extend", "rewind", "concurrent"),
                  ["a note"])
    h = res["headline"]
    assert h["extend_ttft_ratio"] == pytest.approx(1 / 1.1, abs=1e-3)
    assert h["ttft_speedup_rewind"] == 5.0 and h["concurrent_throughput_ratio"] == 1.5
    assert h["extend_ttft_ratio_vs_vllm"] == 2.0 and h["ttft_speedup_rewind_vs_vllm"] == 2.0
    assert h["concurrent_throughput_ratio_vs_vllm"] == 0.5
    assert (h["forkv_peak_rss_mib"], h["peer_peak_rss_mib"], h["vllm_peak_rss_mib"]) == (
        900, 1800, 6000)
    assert not any(k.endswith("_vs_vllm") for k in res["targets"])
    assert res["targets"]["ttft_speedup_rewind"]["met"] is True
    assert [set(c) for c in res["cases"]] == [{"case", "forkv", "mlx_lm_server", "vllm"}] * 3
    assert res["notes"][0] == "a note" and any("vLLM's CPU build" in n for n in res["notes"])


def test_headline_without_vllm_is_the_two_server_one():
    sides = {"forkv": [_side(1.0, 1.0, 30.0, 900)], "peer": [_side(1.0, 4.0, 30.0, 1800)]}
    res = _result("demo:x", QUICK, 1, "float32", sides, ("rewind",), [])
    assert set(res["headline"]) == {"ttft_speedup_rewind", "forkv_peak_rss_mib",
                                    "peer_peak_rss_mib"}
    assert res["targets"]["ttft_speedup_rewind"]["met"] is False


def test_peak_rss_counts_the_child_processes():
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'b = bytearray(200 << 20); import time; time.sleep(30)']); time.sleep(30)")
    proc = ServerProcess("tree", [sys.executable, "-c", code], 1, "m")
    try:
        deadline = time.monotonic() + 20
        while (proc.peak_rss_mib() or 0) < 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.peak_rss_mib() >= 200  # the child's 200 MiB, not just the parent's
    finally:
        for child in _children().get(proc.proc.pid, []):
            os.kill(child, signal.SIGKILL)
        proc.stop()


def test_vllm_setting_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="vllm must be auto, on or off"):
        run_serve_bench("demo:gemma3:tiny", quick=True, vllm="maybe")
    monkeypatch.setattr("forkv.bench.serve.vllm_python", lambda: None)
    with pytest.raises(ValueError, match="vllm=on needs vLLM's CPU build"):
        run_serve_bench("demo:gemma3:tiny", quick=True, vllm="on")
