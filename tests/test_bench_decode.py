"""`forkv bench decode`'s parts that need no server: the edit case's module, the requests,
stream parsing (forkv's draft counts, llama-server's timings), decode tok/s, the identity
checks, the headline; the request plan against fake servers; one slow --quick smoke run."""

import ast
import hashlib
import json
import re
import subprocess
import sys

import pytest
from forkv.bench import decode
from forkv.bench.decode import (
    CASES,
    Ask,
    Stream,
    edit_source,
    headline_of,
    make_asks,
    measure,
    merge_streams,
    stream_chat,
)
from openai.types.chat import ChatCompletionChunk

# -- the requests -----------------------------------------------------------------------------


def _approx_tokens(text: str) -> int:
    """Words and punctuation marks: within a few percent of SmolLM2's and Gemma 3's counts
    of this module (1052 and 1069 tokens when it was written)."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def test_edit_source_is_a_stable_1k_token_module():
    src = edit_source()
    assert src == edit_source()
    assert hashlib.sha256(src.encode()).hexdigest()[:16] == "9a894d960947cb0c"  # changed: say so
    assert 800 <= _approx_tokens(src) <= 1300
    tree = ast.parse(src)
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"parse_record", "merge_batches", "Inventory", "RateLimiter"} <= names
    assert src.count("parse_record") >= 2 and src.count("merge_batches") >= 3  # callers too


def test_quick_source_is_smaller_and_still_has_both_renames():
    src = edit_source(quick=True)
    ast.parse(src)
    assert _approx_tokens(src) < _approx_tokens(edit_source()) / 2
    assert src.count("parse_record") >= 2 and "def merge_batches" in src


def test_asks_pair_a_first_and_a_different_second_request():
    asks = make_asks()
    assert tuple(asks) == CASES
    for first, second in asks.values():
        assert first.messages != second.messages
        assert first.max_tokens == second.max_tokens == 400
    assert {a.max_tokens for pair in make_asks(quick=True).values() for a in pair} == {64}
    assert make_asks(max_tokens=7)["chat"][0].max_tokens == 7
    assert all(a.temperature == 0.0 and a.n == 1 for c in CASES if c not in ("tree", "chatty")
               for a in asks[c])
    # chatty: the chat prompts, sampled and seeded (text a small model does not loop on)
    assert [a.messages for a in asks["chatty"]] == [a.messages for a in asks["chat"]]
    assert all((a.temperature, a.seed, a.n) == (1.0, 1234, 1) for a in asks["chatty"])
    tree = asks["tree"][0]
    assert (tree.n, tree.temperature, tree.seed) == (8, 0.8, 1234)
    edit1, edit2 = (a.messages[-1]["content"] for a in asks["edit"])
    assert "parse_record renamed to read_record" in edit1 and edit_source() in edit1
    assert "merge_batches renamed to combine_batches" in edit2
    assert make_asks() == make_asks()  # deterministic


def test_toolloop_second_step_extends_the_first_and_repeats_its_tool_output():
    first, second = make_asks(quick=True)["toolloop"]
    assert second.messages[:len(first.messages)] == first.messages
    result = next(m["content"] for m in first.messages if m["content"].startswith("Tool result"))
    records = json.loads(result.split("\n", 1)[1])
    assert len(records) == 4 and all(r["status"] == "open" for r in records)
    call = json.loads(second.messages[len(first.messages)]["content"])
    assert call == {"tool": "archive_orders", "arguments": {"orders": records}}


# -- streams and rows -------------------------------------------------------------------------


def _chunk(choices, usage=None, timings=None) -> ChatCompletionChunk:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": choices, "usage": usage}
    return ChatCompletionChunk.model_validate(body | ({"timings": timings} if timings else {}))


class _Fake:
    """An OpenAI client that streams `tokens` one-word chunks per choice; as forkv (one usage,
    draft counts in completion_tokens_details when `details`) or llama-server (a usage and
    timings per request, draft counts when `drafts`)."""

    def __init__(self, *, llama=False, details=None, drafts=None, text="w"):
        self.llama, self.details, self.drafts, self.text = llama, details, drafts, text
        self.calls = []
        self.chat = self.completions = self

    def create(self, *, model, messages, max_tokens, n=1, extra_body=None, seed=None, **kw):
        self.calls.append({"messages": messages, "n": n, "seed": seed,
                           "extra": extra_body or {}, **kw})
        out = [_chunk([{"index": i, "delta": {"content": f"{self.text}{j} "}}])
               for j in range(max_tokens) for i in range(n)]
        usage = {"prompt_tokens": 5, "completion_tokens": max_tokens * n,
                 "total_tokens": 5 + max_tokens * n}
        if self.details is not None:
            usage["completion_tokens_details"] = self.details
        timings = {"predicted_per_second": 50.0}
        if self.drafts:
            timings.update(draft_n=self.drafts[0], draft_n_accepted=self.drafts[1])
        out.append(_chunk([], usage, timings if self.llama else None))
        return iter(out)


def test_forkv_stream_reads_its_draft_counts_and_choices():
    fake = _Fake(details={"accepted_prediction_tokens": 6, "rejected_prediction_tokens": 2})
    s = stream_chat(fake, "m", Ask(({"role": "user", "content": "hi"},), 4, 0.8, 3, n=2),
                    {"speculate": "auto"})
    assert s.texts == ["w0 w1 w2 w3 "] * 2 and s.completion_tokens == 8
    assert (s.accepted, s.drafted, s.server_tps) == (6, 8, None)
    assert fake.calls[0]["n"] == 2 and fake.calls[0]["seed"] == 3
    assert fake.calls[0]["extra"] == {"speculate": "auto"}
    assert fake.calls[0]["stream_options"] == {"include_usage": True}
    assert s.first_s <= s.last_s and s.prompt_tokens == 5


def test_streams_without_draft_counts_report_none():
    s = stream_chat(_Fake(), "m", Ask(({"role": "user", "content": "hi"},), 3))
    assert (s.accepted, s.drafted) == (None, None)
    assert measure(s)["mean_accepted_length"] is None
    s = stream_chat(_Fake(details={"reasoning_tokens": 0}), "m",
                    Ask(({"role": "user", "content": "hi"},), 3))
    assert (s.accepted, s.drafted) == (None, None)  # details without the draft fields


def test_llama_stream_reads_its_timings():
    s = stream_chat(_Fake(llama=True, drafts=(30, 21)), "m",
                    Ask(({"role": "user", "content": "hi"},), 3))
    assert (s.drafted, s.accepted, s.server_tps) == (30, 21, 50.0)


def test_decode_rate_counts_tokens_after_each_choices_first():
    row = measure(Stream(["a", "b"], 202, 0.5, 9, 10.0, 12.0, accepted=150, drafted=180,
                         server_tps=90.0))
    assert row["tokens_per_s"] == 100.0  # (202 - 2 choices) / 2 s
    assert row["mean_accepted_length"] == round(202 / 52, 3)  # tokens per model step
    assert (row["drafted"], row["accepted"], row["choices"]) == (180, 150, 2)
    assert row["server_tokens_per_s"] == 90.0 and row["text"] == "a\x00b"
    assert row["prompt_tokens"] == 9
    assert measure(Stream(["a"], 1, 0.1, 9, 1.0, 1.0))["tokens_per_s"] is None  # no span


def test_merged_streams_span_all_of_them():
    a = Stream(["x"], 11, 0.2, 9, 1.0, 3.0, accepted=4, drafted=5, server_tps=10.0)
    b = Stream(["y"], 11, 0.3, 9, 1.5, 6.0, accepted=2, drafted=3, server_tps=12.0)
    m = merge_streams([a, b])
    assert (m.texts, m.completion_tokens, m.ttft_s, m.first_s, m.last_s) == (
        ["x", "y"], 22, 0.2, 1.0, 6.0)
    assert (m.accepted, m.drafted, m.server_tps) == (6, 8, 22.0)
    assert measure(m)["tokens_per_s"] == 4.0  # (22 - 2) / 5 s
    b.drafted = None
    assert merge_streams([a, b]).drafted is None  # one unknown: the sum is unknown


# -- identity and the headline ----------------------------------------------------------------


def _raw(text: str, tps: float) -> dict:
    return {"tokens_per_s": tps, "completion_tokens": 10, "drafted": None, "text": text}


def test_finish_takes_the_median_and_checks_every_rep_against_off():
    auto = {"edit": {"second": [_raw("A", 10.0), _raw("A", 30.0), _raw("A", 20.0)]}}
    off = {"edit": {"second": [_raw("A", 5.0)] * 3}}
    row = decode._finish(auto, off)["edit"]["second"]
    assert row["tokens_per_s"] == 20.0 and row["tokens_per_s_reps"] == [10.0, 30.0, 20.0]
    assert row["identical_to_off"] is True and "text" not in row
    assert row["text_sha256"] == hashlib.sha256(b"A").hexdigest()[:16]
    off["edit"]["second"][1] = _raw("B", 5.0)
    assert decode._finish(auto, off)["edit"]["second"]["identical_to_off"] is False
    assert decode._finish(off, None)["edit"]["second"]["identical_to_off"] is None


def _rows(same: bool = True, **tps: float) -> dict:
    return {case: {"first": {"tokens_per_s": 1.0, "identical_to_off": same},
                   "second": {"tokens_per_s": v, "identical_to_off": same}}
            for case, v in tps.items()}


def test_headline_reads_the_second_request_against_the_best_spec_type():
    forkv = {"auto": _rows(chat=99.0, chatty=48.0, edit=300.0, toolloop=260.0, tree=400.0),
             "off": _rows(None, chat=100.0, chatty=50.0, edit=90.0, toolloop=95.0, tree=380.0,
                          kernels=120.0)}
    llama = {"none": _rows(None, chat=90.0, edit=80.0, toolloop=85.0, tree=250.0,
                           kernels=100.0),
             "ngram-simple": _rows(chat=88.0, edit=150.0, toolloop=200.0, tree=240.0),
             "ngram-mod": _rows(chat=89.0, edit=200.0, toolloop=130.0, tree=245.0)}
    h = headline_of(forkv, llama, True)
    assert h == {"edit_vs_llamacpp": 1.5, "toolloop_vs_llamacpp": 1.3,
                 "tree_vs_llamacpp": 1.6, "edit_vs_off": 3.333, "chat_spec_vs_off": 0.99,
                 "chatty_spec_vs_off": 0.96, "chat_vs_llamacpp": 1.1, "decode_kernel_ratio": 1.2,
                 "spec_identical": True, "llamacpp_ok": True}
    forkv["auto"]["tree"]["first"]["identical_to_off"] = False
    assert headline_of(forkv, llama, True)["spec_identical"] is False  # first requests count


def test_headline_without_llama_server_keeps_forkv_figures():
    forkv = {"auto": _rows(chat=50.0, edit=90.0), "off": _rows(None, chat=50.0, edit=30.0)}
    h = headline_of(forkv, {}, False)
    assert (h["edit_vs_off"], h["chat_spec_vs_off"], h["spec_identical"]) == (3.0, 1.0, True)
    assert h["edit_vs_llamacpp"] is h["decode_kernel_ratio"] is h["chat_vs_llamacpp"] is None
    assert h["llamacpp_ok"] is False
    assert headline_of({}, {}, False)["spec_identical"] is None  # nothing speculated


def test_llama_server_ran_when_every_spec_type_its_cases_need_did():
    from forkv.bench.decode import llama_ran

    spec = ("none", "ngram-simple", "ngram-mod")
    assert llama_ran({"none": []}, spec, ("kernels",))  # a kernels-only run needs `none` only
    assert not llama_ran({"none": []}, spec, ("edit", "kernels"))
    assert llama_ran(dict.fromkeys(spec, []), spec, ("edit",))
    assert not llama_ran({}, spec, ("kernels",))


def test_draft_notes_speak_of_the_modes_that_ran():
    counted = {"drafted": 12, "accepted": 9}
    unknown = {"drafted": None, "accepted": None}
    plain = {"drafted": 0, "accepted": 0}
    # a kernels-only run sends no speculated request: nothing to say of draft counts
    assert decode.draft_notes({"off": {"kernels": {"second": plain}}}) == []
    assert decode.draft_notes({"auto": {"edit": {"second": counted}},
                               "off": {"edit": {"second": plain}}}) == []
    [note] = decode.draft_notes({"auto": {"edit": {"first": unknown, "second": unknown}}})
    assert "no draft counts" in note
    [note] = decode.draft_notes({"off": {"edit": {"second": counted}}})
    assert "not honoured" in note


def test_targets_follow_the_model():
    assert decode.targets_for("gemma3-270m")["decode_kernel_ratio"] == ">= 1.2"
    assert decode.targets_for("smollm2-135m")["decode_kernel_ratio"] == ">= 1.1"
    assert decode.targets_for("smollm2-135m")["spec_identical"] == "== true"


# -- the request plan, against fake servers ---------------------------------------------------


class _Server:
    name, model, base_url = "fake", "m", "http://127.0.0.1:1/v1"

    def __init__(self):
        self.stopped = False

    def wait_ready(self, timeout):
        pass

    def stop(self):
        self.stopped = True


def test_forkv_plan_sends_each_request_auto_then_off(monkeypatch):
    import openai

    fake = _Fake()
    monkeypatch.setattr(openai, "OpenAI", lambda **kw: fake)
    asks = make_asks(quick=True, max_tokens=3)
    plan = [("auto", decode._SPECULATED, {"speculate": "auto"}),
            ("off", CASES, {"speculate": "off"})]
    server = _Server()
    out = decode._take_turns([("forkv", lambda: server, plan, True)], asks, 1, {"7": -100.0},
                             60, [])
    assert server.stopped and set(out) == {"auto", "off"}
    assert set(out["auto"]) == set(decode._SPECULATED) and set(out["off"]) == set(CASES)
    modes = [c["extra"]["speculate"] for c in fake.calls]
    assert modes == ["auto", "off"] * 10 + ["off", "off"]  # kernels: off only
    assert all(c["extra"]["logit_bias"] == {"7": -100.0} for c in fake.calls)
    assert fake.calls[0]["messages"] == fake.calls[1]["messages"]  # the same request twice
    assert [c["n"] for c in fake.calls if c["n"] > 1] == [8] * 4  # tree: n=8 in one request
    assert out["auto"]["tree"]["second"][0]["completion_tokens"] == 24


def test_llama_plan_sends_tree_branches_as_seeded_requests(monkeypatch):
    import openai

    fake = _Fake(llama=True, drafts=(4, 3))
    monkeypatch.setattr(openai, "OpenAI", lambda **kw: fake)
    asks = make_asks(quick=True, max_tokens=3)
    out = decode._take_turns([("llama", _Server, [("ngram-mod", decode._SPECULATED, {})],
                               False)], asks, 1, {}, 60, [])
    tree_calls = [c for c in fake.calls if c["temperature"] == 0.8]
    assert len(tree_calls) == 16 and all(c["n"] == 1 for c in fake.calls)
    assert sorted(c["seed"] for c in tree_calls[:8]) == list(range(1234, 1242))
    row = out["ngram-mod"]["tree"]["first"][0]
    assert (row["choices"], row["completion_tokens"], row["drafted"], row["accepted"]) == (
        8, 24, 32, 24)
    assert "kernels" not in out["ngram-mod"]


def test_each_rep_runs_on_a_fresh_server(monkeypatch):
    import openai

    monkeypatch.setattr(openai, "OpenAI", lambda **kw: _Fake())
    servers = []

    def start():
        servers.append(_Server())
        return servers[-1]

    asks = {"chat": make_asks(quick=True, max_tokens=3)["chat"]}
    out = decode._take_turns([("forkv", start, [("off", CASES, {})], True)], asks, 3, {}, 60, [])
    assert len(servers) == 3 and all(s.stopped for s in servers)
    assert len(out["off"]["chat"]["second"]) == 3


def test_the_sides_take_turns_and_a_failing_peer_is_a_note(monkeypatch):
    # a machine whose speed drifts over minutes must favour no side
    import openai

    monkeypatch.setattr(openai, "OpenAI", lambda **kw: _Fake())
    order = []

    def side(name, fails=False):
        def start():
            order.append(name)
            if fails:
                raise RuntimeError("did not start")
            return _Server()
        return start

    asks = {"chat": make_asks(quick=True, max_tokens=3)["chat"]}
    notes: list[str] = []
    out = decode._take_turns([("forkv", side("forkv"), [("off", CASES, {})], True),
                              ("peer", side("peer"), [("none", CASES, {})], False),
                              ("bad", side("bad", True), [("mod", CASES, {})], False)],
                             asks, 2, {}, 60, notes)
    assert order == ["forkv", "peer", "bad", "forkv", "peer"]
    assert set(out) == {"off", "none"} and len(out["none"]["chat"]["first"]) == 2
    assert notes == ["No bad side: RuntimeError: did not start"]


def test_every_request_goes_to_each_side_in_turn_with_all_of_them_up(monkeypatch):
    # sides run minutes apart would read the machine's drift as their ratio
    import openai

    sent, up = [], []

    class Side(_Server):
        def __init__(self, name):
            super().__init__()
            self.base_url = f"http://127.0.0.1:1/{name}"
            up.append(self)

    def client(base_url, **kw):
        fake = _Fake()
        real = fake.create

        def create(**a):
            assert not any(s.stopped for s in up[-2:])  # both sides are up for each request
            sent.append((base_url.rsplit("/", 1)[1], a["messages"][0]["content"][:12]))
            return real(**a)
        fake.create = create
        return fake

    monkeypatch.setattr(openai, "OpenAI", client)
    asks = {"chat": make_asks(quick=True, max_tokens=3)["chat"]}
    decode._take_turns([("forkv", lambda: Side("f"), [("off", CASES, {})], True),
                        ("peer", lambda: Side("p"), [("none", CASES, {})], False)],
                       asks, 2, {}, 60, [])
    first, second = (a.messages[0]["content"][:12] for a in asks["chat"])
    assert sent == [("f", first), ("p", first), ("f", second), ("p", second),  # rep 1
                    ("p", first), ("f", first), ("p", second), ("f", second)]  # rep 2: rotated
    assert len(up) == 4 and all(s.stopped for s in up)  # fresh servers each rep, stopped


def test_settings_are_checked():
    with pytest.raises(ValueError, match="llamacpp must be auto, on or off"):
        decode.run_decode_bench("demo:gemma3:tiny", quick=True, llamacpp="maybe")
    with pytest.raises(ValueError, match="Unknown decode case nope"):
        decode.run_decode_bench("demo:gemma3:tiny", quick=True, cases=("nope",))
    with pytest.raises(ValueError, match="none is the reference"):
        decode.run_decode_bench("demo:gemma3:tiny", quick=True, spec_types=("ngram-mod",))


def test_quick_runs_the_demo_model(monkeypatch):
    import forkv.bench as bench

    seen = []
    monkeypatch.setattr(bench, "_function", lambda name: lambda model, quick, **kw: seen.append(
        model) or {"model": model, "headline": {}, "targets": {}})
    bench.run_benchmark("decode", quick=True)
    assert seen == ["demo:gemma3:tiny"]
    assert bench.BENCHMARKS["decode"][2] == ("smollm2-135m", "gemma3-270m")


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.slow  # forkv serve on demo:gemma3:tiny, no llama-server (a demo has no GGUF)
def test_quick_decode_bench_runs_forkv_alone(tmp_path):
    path = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "decode", "--quick",
                        "--json", str(path)], capture_output=True, text=True, timeout=900,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(path.read_text())
    assert data["benchmark"] == "decode" and data["model"] == "demo:gemma3:tiny"
    h = data["headline"]
    assert h["llamacpp_ok"] is False and h["edit_vs_llamacpp"] is None
    assert h["edit_vs_off"] and h["chat_spec_vs_off"] and h["spec_identical"] is not None
    assert any("not a GGUF" in n for n in data["notes"])
    assert [c["case"] for c in data["cases"]] == list(CASES)
    for case in data["cases"]:
        assert case["llama_server"] == {}
        row = case["forkv"]["off"]["second"]
        assert row["completion_tokens"] == 64 * row["choices"] and row["tokens_per_s"] > 0
