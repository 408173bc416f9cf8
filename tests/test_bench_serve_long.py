"""`forkv bench serve`'s long case: its requests against a fake server, the server it runs in
(a fresh one per side, after every side's other cases, the sides taking turns rep by rep,
whose peak RSS is the case's), the
llama-server flags it starts with, its headline figures, and one real run on forkv serve with
a demo model and a tiny prompt."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from forkv.bench import llamacpp, serve
from forkv.bench.serve import QUICK, _result, _Side, run_serve_bench
from forkv.bench.serve_cases import FULL, Client, long_context, run_case

from tests.test_bench_serve import _Fake, _Tok


def test_long_case_decodes_then_forks_and_rewinds_on_the_long_text():
    fake = _Fake()
    sz = replace(QUICK, long_tokens=40, long_decode_tokens=6)
    out = run_case(Client(fake, "m", no_eos={"1": -100.0}), "long", sz, _Tok(), 0)
    first, fork, rewind = (c["messages"] for c in fake.calls)
    assert fake.calls[0]["extra"] == {"1": -100.0}  # no end of sequence while it decodes
    assert len(first) == 1 and first[0]["role"] == "user"  # no system message
    text = first[0]["content"].rsplit("\n\nQuestion A", 1)[0]
    assert len(text.split()) == 40
    assert fork[0]["content"].startswith(text + "\n\nQuestion B")  # the fork: same text
    assert rewind[:1] == first and rewind[1]["role"] == "assistant"  # back to branch A
    assert out["decode_tokens"] == 6
    assert out["long_prompt_tokens"] == 1 + 40 + 6  # the fake counts the role and words
    assert out["fork_cached_tokens"] > 40 and out["rewind_cached_tokens"] > 40
    assert out["fork_computed_tokens"] == out["fork_prompt_tokens"] - out["fork_cached_tokens"]
    assert out["prefill_tokens_per_s"] > 0 and out["decode_tokens_per_s"] > 0
    assert out["ttft_median_s"] >= 0 and out["requests"] == 3


def test_long_context_holds_the_prompt_decode_and_rewind_in_whole_blocks():
    assert long_context(FULL) == 32768  # Gemma 3 270M's whole context
    assert long_context(replace(FULL, long_tokens=2048)) == 2816
    assert long_context(QUICK) % 256 == 0


class _Server:
    def __init__(self, name: str, rss: float, log: list):
        self.name, self.rss, self.log = name, rss, log
        log.append(("start", name))

    def wait_ready(self, timeout):
        pass

    def peak_rss_mib(self):
        return self.rss

    def stop(self):
        self.log.append(("stop", self.name))


def test_long_case_runs_in_a_fresh_server_after_the_others_the_sides_taking_turns(
        monkeypatch):
    log = []
    monkeypatch.setattr(serve, "_cases", lambda server, side, sz, tok, rep, cases, no_eos: {
        c: {"on": server.name} for c in cases})
    side = _Side(lambda _: _Server("shared", 300.0, log),
                 start_long=lambda ctx: _Server(f"long {ctx}", 900.0, log))
    only_long = _Side(None, start_long=lambda ctx: _Server("q8", 350.0, log))
    assert only_long.cases(("fork", "long")) == ("long",)
    assert _Side(lambda _: None).cases(("fork", "long")) == ("fork",)
    runs = {"forkv": serve._run_side(side, QUICK, None, 2, ("fork",), {})}
    serve._run_long({"forkv": side, "q8": only_long}, runs, QUICK, None, 2, {}, [])
    ctx = long_context(QUICK)
    assert log == [("start", "shared"), ("stop", "shared"),
                   ("start", f"long {ctx}"), ("stop", f"long {ctx}"),  # rep 0: forkv first
                   ("start", "q8"), ("stop", "q8"),
                   ("start", "q8"), ("stop", "q8"),  # rep 1: the other way round
                   ("start", f"long {ctx}"), ("stop", f"long {ctx}")]
    assert runs["forkv"][0]["fork"] == {"on": "shared"}
    assert runs["forkv"][0]["long"] == {"on": f"long {ctx}", "peak_rss_mib": 900.0}
    assert [r["peak_rss_mib"] for r in runs["forkv"]] == [900.0, 900.0]  # its largest server
    assert runs["q8"] == [{"long": {"on": "q8", "peak_rss_mib": 350.0}, "peak_rss_mib": 350.0}] * 2


def test_an_optional_side_whose_long_case_fails_keeps_its_other_cases(monkeypatch):
    monkeypatch.setattr(serve, "_cases", lambda server, side, sz, tok, rep, cases, no_eos: {
        c: {"on": server.name} for c in cases})

    def broken(ctx):
        raise OSError("no such binary")

    log, notes = [], []
    runs = {"a": [{"fork": {}, "peak_rss_mib": 1.0}]}
    serve._run_long({"a": _Side(lambda _: None, optional=True, start_long=broken),
                     "b": _Side(None, optional=True, start_long=broken),
                     "c": _Side(None, start_long=lambda ctx: _Server("c", 2.0, log))},
                    runs, QUICK, None, 1, {}, notes)
    assert runs == {"a": [{"fork": {}, "peak_rss_mib": 1.0}],
                    "c": [{"long": {"on": "c", "peak_rss_mib": 2.0}, "peak_rss_mib": 2.0}]}
    assert [n.split(":")[0] for n in notes] == ["No a long case", "No b long case"]
    with pytest.raises(OSError):  # a side that is not optional fails the run
        serve._run_long({"d": _Side(None, start_long=broken)}, {}, QUICK, None, 1, {}, [])


def test_llama_server_for_the_long_case_has_one_slot_its_context_and_kv_type(monkeypatch):
    monkeypatch.setattr(llamacpp, "repack_crashes", lambda binary, gguf: True)
    monkeypatch.setattr(llamacpp, "ServerProcess", lambda name, cmd, port, model: (
        SimpleNamespace(name=name, cmd=" ".join(cmd))))
    server = llamacpp.start_llama_server("llama-server", "m.gguf", context=32768,
                                         kv_type="q8_0")
    assert server.name == "llama-server q8_0" and "--no-repack" in server.cmd
    assert "-np 1 -c 32768" in server.cmd and "-ctk q8_0 -ctv q8_0" in server.cmd
    server = llamacpp.start_llama_server("llama-server", "m.gguf")  # its defaults
    assert server.name == "llama-server" and "-c " not in server.cmd and "-ctk" not in server.cmd


def _long(rss: float, prefill: float, decode: float, ttft: float = 1.0) -> dict:
    return {"ttft_median_s": ttft, "computed_tokens": 32000, "prompt_tokens": 64000,
            "cached_tokens_total": 32000, "tokens_per_s": 5.0, "peak_rss_mib": rss,
            "prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}


def _fork(ttft: float) -> dict:
    return {"ttft_median_s": ttft, "later_ttft_s": ttft, "computed_tokens": 100,
            "prompt_tokens": 1000, "cached_tokens_total": 900, "tokens_per_s": 5.0}


def test_long_headline_is_forkv_over_each_llama_server():
    sides = {"forkv": [{"fork": _fork(0.1), "long": _long(540.0, 300.0, 40.0, 0.2),
                        "peak_rss_mib": 700.0}],
             "forkv_exact": [{"fork": _fork(0.2), "peak_rss_mib": 600.0}],
             "peer": [{"fork": _fork(1.0), "peak_rss_mib": 800.0}],
             "llamacpp": [{"fork": _fork(0.5), "long": _long(450.0, 400.0, 32.0, 2.0),
                           "peak_rss_mib": 450.0}],
             "llamacpp_tuned": [{"fork": _fork(0.4), "peak_rss_mib": 1500.0}],
             "llamacpp_q8": [{"long": _long(360.0, 250.0, 50.0, 4.0), "peak_rss_mib": 360.0}],
             "forkv_q8": [{"long": _long(432.0, 300.0, 45.0, 0.2), "peak_rss_mib": 432.0}]}
    res = _result("gemma3-270m", FULL, 1, "float32", sides, ("fork", "long"), [],
                  {"llamacpp_ok": True})
    h, t = res["headline"], res["targets"]
    assert (h["long_rss_vs_llamacpp"], h["long_prefill_vs_llamacpp"],
            h["long_decode_vs_llamacpp"]) == (1.2, 0.75, 1.25)
    assert (h["long_rss_vs_llamacpp_q8"], h["long_prefill_vs_llamacpp_q8"],
            h["long_decode_vs_llamacpp_q8"]) == (1.5, 1.2, 0.8)
    assert h["ttft_ratio_long_vs_llamacpp"] == 0.1 and h["ttft_ratio_fork_vs_llamacpp"] == 0.2
    assert h["ttft_ratio_long_vs_llamacpp_q8"] == 0.05
    assert "ttft_ratio_fork_vs_llamacpp_q8" not in h  # it ran the long case only
    assert "long_rss_vs_llamacpp_tuned" not in h and "ttft_ratio_long_vs_llamacpp_tuned" not in h
    assert "fast_ttft_speedup_long" not in h and "exact_computed_ratio_vs_llamacpp_q8" not in h
    assert (h["forkv_peak_rss_mib"], h["forkv_long_peak_rss_mib"]) == (700.0, 540.0)
    assert (h["llamacpp_peak_rss_mib"], h["llamacpp_q8_peak_rss_mib"]) == (450.0, 360.0)
    assert "peer_long_peak_rss_mib" not in h
    assert (t["long_rss_vs_llamacpp"]["met"], t["long_prefill_vs_llamacpp"]["met"],
            t["long_decode_vs_llamacpp"]["met"]) == (True, False, True)
    # q8_0 K/V on both sides: its RSS has a target; forkv's default against it does not
    assert (h["long_rss_q8_vs_llamacpp_q8"], h["long_prefill_q8_vs_llamacpp_q8"],
            h["long_decode_q8_vs_llamacpp_q8"]) == (1.2, 1.2, 0.9)
    assert [k for k in t if k.endswith("_vs_llamacpp_q8")] == ["long_rss_q8_vs_llamacpp_q8"]
    assert t["long_rss_q8_vs_llamacpp_q8"]["met"] is False
    assert h["forkv_q8_long_peak_rss_mib"] == 432.0
    long = res["cases"][1]
    assert long["case"] == "long"
    assert set(long["summary"]) == {"forkv", "forkv_q8", "llama_server", "llama_server_q8"}
    assert long["summary"]["llama_server_q8"]["peak_rss_mib"] == 360.0
    assert any(n.startswith("long: one prompt of 32,000 tokens") and "-c 32,768" in n
               for n in res["notes"])


@pytest.mark.slow  # two real servers (float16 and q8_0 K/V): CI's --slow run
def test_long_case_runs_on_forkv_serve():
    res = run_serve_bench("demo:gemma3:tiny", quick=True, cases=("long",), vllm="off",
                          llamacpp="off", exact="off", mlx_lm="off", drift="off",
                          long_tokens=48, long_decode_tokens=8)
    (case,) = res["cases"]
    (run,) = case["forkv"]
    assert case["case"] == "long" and set(case["summary"]) == {"forkv", "forkv_q8"}
    assert run["decode_tokens"] == 8  # end of sequence suppressed
    assert run["long_prompt_tokens"] > 48
    assert run["prefill_tokens_per_s"] > 0 and run["decode_tokens_per_s"] > 0
    assert run["fork_cached_tokens"] > 0 and run["rewind_cached_tokens"] > 0
    assert 0 < run["fork_computed_tokens"] < run["fork_prompt_tokens"]
    assert run["peak_rss_mib"] > 0
    h = res["headline"]
    assert h["forkv_peak_rss_mib"] == h["forkv_long_peak_rss_mib"] == run["peak_rss_mib"]
    assert not any(k.startswith("long_") for k in h)  # no llama-server side to compare with
    (q8,) = case["forkv_q8"]  # --kv-bits 8 (the demo's head_dim, 32, takes it)
    assert q8["decode_tokens"] == 8 and q8["fork_cached_tokens"] > 0 and q8["peak_rss_mib"] > 0


@pytest.mark.parametrize("setting", ["long_tokens", "long_decode_tokens"])
def test_long_sizes_are_settings(setting):
    from forkv.bench.options import parse_settings

    assert parse_settings(run_serve_bench, [f"{setting}=2_048"]) == {setting: 2048}


def test_no_peak_rss_gives_no_rss_figure():
    sides = {"forkv": [{"long": _long(None, 300.0, 40.0), "peak_rss_mib": None}],
             "llamacpp": [{"long": _long(None, 400.0, 32.0), "peak_rss_mib": None}]}
    res = _result("m.gguf", FULL, 1, "float32", sides, ("long",), [])
    assert res["headline"]["long_rss_vs_llamacpp"] is None  # not 0.0, which would meet <= 1.2
    assert res["targets"]["long_rss_vs_llamacpp"]["met"] is None
    assert "peak_rss_mib" not in res["cases"][0]["summary"]["forkv"]
