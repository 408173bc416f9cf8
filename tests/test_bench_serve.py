"""`forkv bench serve`'s parts that need no server: the vLLM view of a model folder, the
cases against a fake OpenAI server, the headline figures against each peer (llama-server's
included), peak RSS over a process tree, setting checks."""

import json
import os
import signal
import sys
import time

import pytest
from forkv.bench import cluster_vllm
from forkv.bench.serve import QUICK, _result, run_serve_bench
from forkv.bench.serve_cases import CASES, Client, case_clients, run_case
from forkv.bench.serve_procs import ServerProcess, _children, timed_chat
from openai.types.chat import ChatCompletionChunk


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
    assert [set(c) for c in res["cases"]] == [
        {"case", "summary", "forkv", "mlx_lm_server", "vllm"}] * 3
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


def test_a_server_hears_stops_ctrl_c_though_the_bench_runs_with_sigint_ignored():
    # A bench started in the background has SIGINT ignored; its servers must not inherit that
    # (they would wait out stop's 20 s and be killed).
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = ServerProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                             1, "m")
    finally:
        signal.signal(signal.SIGINT, before)
    time.sleep(0.5)  # (past the interpreter's start, where it installs its handler)
    t0 = time.monotonic()
    proc.stop()
    assert time.monotonic() - t0 < 10 and proc.proc.returncode != -signal.SIGKILL


def test_vllm_setting_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="vllm must be auto, on or off"):
        run_serve_bench("demo:gemma3:tiny", quick=True, vllm="maybe")
    monkeypatch.setattr("forkv.bench.serve.vllm_python", lambda: None)
    with pytest.raises(ValueError, match="vllm=on needs vLLM's CPU build"):
        run_serve_bench("demo:gemma3:tiny", quick=True, vllm="on")


def test_llamacpp_setting_is_checked():
    with pytest.raises(ValueError, match="llamacpp must be auto, on or off"):
        run_serve_bench("demo:gemma3:tiny", quick=True, llamacpp="maybe")
    with pytest.raises(ValueError, match="llamacpp=on needs a GGUF model"):
        run_serve_bench("demo:gemma3:tiny", quick=True, llamacpp="on")


# -- the cases, on a fake server -------------------------------------------------------------


def _chunk(choices, usage=None, timings=None) -> ChatCompletionChunk:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": choices, "usage": usage}
    return ChatCompletionChunk.model_validate(body | ({"timings": timings} if timings else {}))


class _Fake:
    """An OpenAI client whose server counts words as tokens and reuses the longest prefix of
    any earlier prompt; `llama` answers as llama-server does (a usage and timings per choice)."""

    def __init__(self, llama: bool = False):
        self.llama, self.seen, self.calls = llama, [], []
        self.chat = self
        self.completions = self

    def create(self, *, model, messages, max_tokens, n=1, extra_body=None, **_):
        words = " ".join(m["role"] + " " + m["content"] for m in messages).split()
        cached = max((_common(words, w) for w in self.seen), default=0)
        self.seen.append(words)
        self.calls.append({"messages": messages, "n": n, "extra": extra_body or {}})
        usage = {"prompt_tokens": len(words), "completion_tokens": max_tokens,
                 "total_tokens": len(words) + max_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        out = []
        for i in range(n):
            out.append(_chunk([{"index": i, "delta": {"content": "w " * max_tokens}}]))
            out.append(_chunk([{"index": i, "delta": {}, "finish_reason": "length"}]))
            if self.llama:
                out.append(_chunk([], usage, {"prompt_n": len(words) - cached,
                                              "cache_n": cached, "prompt_per_second": 100.0,
                                              "predicted_per_second": 20.0}))
        if not self.llama:
            out.append(_chunk([], dict(usage, completion_tokens=max_tokens * n)))
        return iter(out)


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return text.split()

    def decode(self, tokens):
        return " ".join(tokens)


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_reports_the_common_figures(name):
    fake = _Fake()
    out = run_case(Client(fake, "m", no_eos={"1": -100.0}), name, QUICK, _Tok(), 0)
    assert {"ttft_median_s", "prompt_tokens", "computed_tokens", "cached_tokens_total",
            "tokens_per_s", "case_wall_s"} <= set(out)
    assert out["requests"] == len(fake.calls) > 0
    assert out["prompt_tokens"] >= out["computed_tokens"] > 0


def test_llama_server_timings_give_computed_and_cached_tokens():
    r = timed_chat(_Fake(llama=True), "m", [{"role": "user", "content": "a b c"}], 3, n=2)
    assert (r.prompt_tokens, r.cached_tokens, r.computed_tokens) == (4, 0, 4)  # once, not twice
    assert r.completion_tokens == 6  # a usage per choice
    assert (r.server_prompt_tps, r.server_decode_tps) == (100.0, 20.0)
    fake = _Fake()
    timed_chat(fake, "m", [{"role": "user", "content": "a b c"}], 3)
    r = timed_chat(fake, "m", [{"role": "user", "content": "a b c d"}], 3)
    assert (r.prompt_tokens, r.cached_tokens, r.computed_tokens) == (5, 4, 1)


class _ByteFirst:
    """A stream whose first token is a byte of a character: no text until the second one."""

    def __init__(self):
        self.chat, self.completions, self.asked = self, self, []

    def create(self, **kw):
        self.asked.append(kw.get("logprobs"))
        lp = {"content": [{"token": "x", "logprob": -0.1, "bytes": [240], "top_logprobs": []}]}
        byte = {"index": 0, "delta": {}, "logprobs": lp if kw.get("logprobs") else None}
        rest = {"index": 0, "delta": {"content": "\U0001f600"}, "finish_reason": "length"}

        def chunks():
            yield _chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
            yield _chunk([byte])
            time.sleep(0.05)  # the second token's decode step
            yield _chunk([rest])
        return chunks()


def test_the_token_clock_stops_at_a_first_token_without_text():
    fake = _ByteFirst()
    by_text = timed_chat(fake, "m", [{"role": "user", "content": "hi"}], 2)
    by_token = timed_chat(fake, "m", [{"role": "user", "content": "hi"}], 2, token_clock=True)
    assert fake.asked == [None, True]  # only the token clock asks for logprobs
    assert by_text.ttft_s >= 0.05 > by_token.ttft_s
    assert by_text.text == by_token.text == "\U0001f600"


def test_a_side_about_q8_0_fails_on_a_server_that_caches_another_format():
    from forkv.bench.serve import _check_kv, _Side
    from server_proc import TINY, shared_server

    url = shared_server(*TINY)
    server = type("S", (), {"base_url": url + "/v1", "model": "demo:qwen3:tiny",
                            "name": "forkv serve"})()
    _check_kv(server, _Side(None))  # a side about no format: not asked
    with pytest.raises(RuntimeError, match="not q8_0"):
        _check_kv(server, _Side(None, kv_dtype="q8_0"))  # head_dim 16: float16 instead
    import openai

    got = openai.OpenAI(base_url=url + "/v1", api_key="x").models.retrieve(server.model)
    _check_kv(server, _Side(None, kv_dtype=got.kv_dtype))


def test_deep_rewind_goes_back_to_each_earlier_turn():
    fake = _Fake()
    out = run_case(Client(fake, "m"), "deep_rewind", QUICK, _Tok(), 0)
    turns = QUICK.deep_turns
    trajectory = fake.calls[turns - 1]["messages"]  # the case's list: every answer appended
    assert len(trajectory) == 1 + 2 * turns
    assert [r["k"] for r in out["rewinds"]] == list(range(1, turns))
    for k, call in enumerate(fake.calls[turns:], start=1):
        assert call["messages"][:-1] == trajectory[:1 + 2 * k]  # after turn k's answer
        assert call["messages"][-1]["content"].startswith(f"Back to log {k - 1}")
    assert all(r["cached_tokens"] > 0 for r in out["rewinds"])  # the fake reuses prefixes


def test_prune_drops_the_thinking_from_the_next_step():
    fake = _Fake()
    run_case(Client(fake, "m"), "prune", QUICK, _Tok(), 0)
    second_think = fake.calls[2]["messages"]
    assert not any("<think>" in m["content"] for m in second_think)
    assert "<think>" in fake.calls[1]["messages"][-2]["content"]


def test_tree_samples_n_or_sends_n_requests():
    fake = _Fake()
    run_case(Client(fake, "m"), "tree", QUICK, _Tok(), 0)
    assert [c["n"] for c in fake.calls] == [QUICK.tree_branches // 2, QUICK.tree_branches]
    fake = _Fake()
    out = run_case(Client(fake, "m", takes_n=False), "tree", QUICK, _Tok(), 0)
    assert len(fake.calls) == QUICK.tree_branches * 3 // 2 and {c["n"] for c in fake.calls} == {1}
    assert [r["generated_tokens"] for r in out["runs"]] == [
        k * QUICK.gen_tokens for k in (QUICK.tree_branches // 2, QUICK.tree_branches)]


def test_tenants_salt_each_client_in_the_second_part():
    fake = _Fake()
    out = run_case(Client(fake, "m", no_eos={"1": -100.0}), "tenants", QUICK, _Tok(), 0)
    salts = [c["extra"]["cache_salt"] for c in fake.calls]
    assert len(set(salts[:QUICK.clients])) == 1 and len(set(salts[QUICK.clients:])) == QUICK.clients
    assert all(c["extra"]["1"] == -100.0 for c in fake.calls)
    assert out["tokens_per_s"] == out["tokens_per_s_salted"]
    assert out["compared_computed_tokens"] == out["computed_tokens_one_salt"]
    assert case_clients("tenants", QUICK) == QUICK.clients and case_clients("fork", QUICK) == 1


# -- llama-server's figures ------------------------------------------------------------------


def _full_side(ttft: float, computed: int, rewinds: list[tuple[float, int]], prefill: float,
               tps_one: float = 10.0, tps_salted: float = 9.0) -> dict:
    common = {"ttft_median_s": ttft, "computed_tokens": computed, "tokens_per_s": 5.0,
              "prompt_tokens": 1000, "cached_tokens_total": 1000 - computed}
    return {"fork": dict(common, later_ttft_s=ttft),
            "deep_rewind": dict(common, rewinds=[
                {"k": k, "ttft_s": t, "cached_tokens": c, "prompt_tokens": 1000}
                for k, (t, c) in enumerate(rewinds, start=1)]),
            "kernels": dict(common, prefill_tokens_per_s=prefill, decode_tokens_per_s=50.0,
                            prefill_short_tokens_per_s=prefill / 2),
            "tenants": dict(common, tokens_per_s_one_salt=tps_one, computed_tokens=10**6,
                            tokens_per_s_salted=tps_salted, compared_computed_tokens=computed),
            "peak_rss_mib": 500}


def test_headline_against_llama_server():
    ran = ("fork", "deep_rewind", "kernels", "tenants")
    forkv = _full_side(0.1, 100, [(0.1, 900), (0.1, 950), (0.2, 990)], 400.0)
    sides = {"forkv": [forkv], "peer": [_full_side(1.0, 900, [(1.0, 0)] * 3, 300.0)],
             "llamacpp": [_full_side(2.0, 400, [(2.0, 0), (3.0, 850), (0.2, 950)], 800.0)],
             "llamacpp_tuned": [_full_side(0.5, 50, [(0.1, 900)] * 3, 800.0)]}
    res = _result("gemma3-270m", QUICK, 1, "float32", sides, ran, [], {"llamacpp_ok": True})
    h = res["headline"]
    assert h["ttft_ratio_fork_vs_llamacpp"] == 0.05
    assert h["ttft_ratio_fork_vs_llamacpp_tuned"] == 0.2
    assert h["computed_ratio_vs_llamacpp"] == 0.25  # the same in every case (tenants: 1 salt)
    assert h["computed_ratio_vs_llamacpp_tuned"] == 2.0
    # Only the rewinds where llama-server restored under 90% of the prompt: 2.0/0.1, 3.0/0.1.
    assert h["ttft_speedup_deep_rewind_vs_llamacpp"] == 25.0
    assert h["ttft_speedup_deep_rewind_vs_llamacpp_tuned"] is None  # it restored each one
    assert h["prefill_kernel_ratio"] == 0.5 and h["decode_kernel_ratio"] == 1.0
    assert h["prefill_short_kernel_ratio"] == 0.5
    assert h["tenant_throughput_ratio"] == 0.9 and h["tenant_throughput_vs_shared_mlx_lm"] == 1.0
    assert h["llamacpp_ok"] is True and h["llamacpp_tuned_peak_rss_mib"] == 500
    t = res["targets"]
    assert t["ttft_speedup_deep_rewind_vs_llamacpp"]["met"] is True
    assert t["computed_ratio_vs_llamacpp"]["met"] is True and t["llamacpp_ok"]["met"] is True
    assert t["tenant_throughput_ratio"]["met"] is True
    fork = res["cases"][0]
    assert set(fork["summary"]) == {"forkv", "mlx_lm_server", "llama_server",
                                    "llama_server_tuned"}
    assert fork["summary"]["llama_server"]["computed_tokens"] == 400
    assert any("llama-server" in n for n in res["notes"])
