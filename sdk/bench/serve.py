"""`forkv bench serve`: the same conversations, sent with the `openai` client, to `forkv serve`
and to mlx-lm's own `mlx_lm.server` on the same model folder, side by side in one run; and,
where vLLM's CPU build is installed (see `cluster_vllm`), to vLLM on the same weights too.

Five cases (each side gets the same requests, greedy; forkv first, then mlx_lm.server, then vLLM):

1. extend: multi-turn chat, each prompt extends the last exactly (the peer's LRU of prompt
   caches serves this well: parity is the target, forkv's later-turn TTFT within 10%);
2. reasoning: the client sends back only a short answer, as a thinking model's template drops
   the reasoning it generated, so the next prompt leaves the generated tokens (reported);
3. fork: one long document, then separate conversations each asking another question in the
   same user message (the branch starts inside it): `ttft_speedup_fork`, peer ÷ forkv;
4. rewind: `rewind_turns` turns, then back to turn 2 and a new branch, both servers at their
   default cache sizes: `ttft_speedup_rewind`;
5. concurrent: clients sharing a system prompt at once: `concurrent_throughput_ratio`
   (generated tokens/s, forkv ÷ peer), and every server's peak RSS over the whole run.

Texts are sized in the model's own tokens and drawn from a fixed seed, so every side and
repeated runs see the same prompts. The vLLM figures (`*_vs_vllm`, forkv against vLLM with its
prefix caching) have no targets yet: the first measurement sets them. Knows the cases; the
processes are in `serve_procs` and `cluster_vllm`.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

from .cluster_vllm import start_vllm, vllm_python, vllm_view
from .common import result
from .serve_procs import start_forkv, start_peer, timed_chat

__all__ = ["Sizes", "run_serve_bench"]


@dataclass(frozen=True, slots=True)
class Sizes:
    system_tokens: int  # system prompt of every case
    turn_tokens: int  # user text per turn (extend, reasoning, rewind)
    turns: int  # extend and reasoning turns
    doc_tokens: int  # the fork case's document
    questions: int  # conversations on the document
    rewind_turns: int
    clients: int  # concurrent case
    gen_tokens: int  # tokens generated per request in the concurrent case
    answer_tokens: int  # tokens generated per request elsewhere (TTFT is what is timed)


FULL = Sizes(system_tokens=256, turn_tokens=512, turns=6, doc_tokens=6900, questions=8,
             rewind_turns=12, clients=8, gen_tokens=64, answer_tokens=8)
QUICK = Sizes(system_tokens=64, turn_tokens=96, turns=3, doc_tokens=600, questions=3,
              rewind_turns=4, clients=3, gen_tokens=8, answer_tokens=4)
TARGETS = {"extend_ttft_ratio": "<= 1.1", "ttft_speedup_fork": ">= 20",
           "ttft_speedup_rewind": ">= 5", "concurrent_throughput_ratio": ">= 1.5"}
_WORDS = ("river stone lamp orbit cedar quartz meadow signal harbor copper violet lantern "
          "summit ember glacier falcon prism canyon willow beacon").split()


class _Texts:
    """Deterministic filler text of an exact token length in the model's tokenizer."""

    def __init__(self, tokenizer, seed: int):
        self.tok, self.rng = tokenizer, random.Random(seed)

    def __call__(self, n: int) -> str:
        words = " ".join(self.rng.choice(_WORDS) for _ in range(n * 2))
        return self.tok.decode(self.tok.encode(words, add_special_tokens=False)[:n])


def _med(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def _extend(client, model, sz, texts, system, drop_answers: bool) -> dict:
    messages, ttft, cached = [system], [], []
    for turn in range(sz.turns):
        messages.append({"role": "user", "content": f"Turn {turn}. " + texts(sz.turn_tokens)})
        r = timed_chat(client, model, messages, sz.answer_tokens)
        ttft.append(r.ttft_s)
        cached.append(r.cached_tokens)
        answer = f"Answer {turn}." if drop_answers else r.text
        messages.append({"role": "assistant", "content": answer})
    return {"ttft_s": ttft, "later_ttft_s": _med(ttft[1:]), "cached_tokens": cached}


def _fork(client, model, sz, texts, system) -> dict:
    doc = texts(sz.doc_tokens)
    ttft, cached = [], []
    for q in range(sz.questions):
        question = f"\n\nQuestion {q}: what does part {q} say about {_WORDS[q % len(_WORDS)]}?"
        r = timed_chat(client, model, [system, {"role": "user", "content": doc + question}],
                       sz.answer_tokens)
        ttft.append(r.ttft_s)
        cached.append(r.cached_tokens)
    return {"ttft_s": ttft, "first_ttft_s": ttft[0], "later_ttft_s": _med(ttft[1:]),
            "cached_tokens": cached}


def _rewind(client, model, sz, texts, system) -> dict:
    messages, history = [system], []
    for turn in range(sz.rewind_turns):
        messages.append({"role": "user", "content": f"Turn {turn}. " + texts(sz.turn_tokens)})
        r = timed_chat(client, model, messages, sz.answer_tokens)
        messages.append({"role": "assistant", "content": r.text})
        history.append(list(messages))
    branch = history[1] + [{"role": "user", "content": "Back to this point: " +
                            texts(sz.turn_tokens // 4)}]
    r = timed_chat(client, model, branch, sz.answer_tokens)
    return {"rewind_ttft_s": r.ttft_s, "cached_tokens": r.cached_tokens,
            "conversation_tokens": sz.system_tokens + sz.rewind_turns * sz.turn_tokens}


def _concurrent(client, model, sz, texts, system) -> dict:
    questions = [f"Client {i}: " + texts(32) for i in range(sz.clients)]

    def one(q: str):
        return timed_chat(client, model, [system, {"role": "user", "content": q}],
                          sz.gen_tokens)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(sz.clients) as pool:
        out = list(pool.map(one, questions))
    wall = time.perf_counter() - t0
    tokens = sum(r.completion_tokens for r in out)
    return {"wall_s": round(wall, 3), "generated_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 3), "ttft_s": [r.ttft_s for r in out]}


CASES = ("extend", "reasoning", "fork", "rewind", "concurrent")


def _run_side(server, sz: Sizes, tokenizer, seed: int, cases: tuple[str, ...]) -> dict:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0,
                           timeout=3600)
    model = server.model
    timed_chat(client, model, [{"role": "user", "content": "warm up"}], 2)  # kernels compile
    out = {}
    for i, (name, fn) in enumerate(zip(CASES, (_extend, _extend, _fork, _rewind, _concurrent))):
        if name not in cases:
            continue
        texts = _Texts(tokenizer, seed * 100 + i)  # each case its own texts: no cross-reuse
        system = {"role": "system", "content": f"Case {name}. " + texts(sz.system_tokens)}
        args = (client, model, sz, texts, system) + ((name == "reasoning",)
                                                      if fn is _extend else ())
        t0 = time.perf_counter()
        out[name] = fn(*args)
        out[name]["case_wall_s"] = round(time.perf_counter() - t0, 2)
        print(f"  {server.name}: {name} {out[name]['case_wall_s']} s", file=sys.stderr,
              flush=True)  # a full run takes many minutes: show where it is
    out["peak_rss_mib"] = server.peak_rss_mib()
    return out


def run_serve_bench(model: str = "demo:gemma3:small", quick: bool = False, reps: int = 1,
                    cases: tuple[str, ...] = CASES, vllm: str = "auto",
                    sizes: Sizes | None = None, **size: int) -> dict:
    """Each case on `forkv serve` then on `mlx_lm.server` (same folder, same BLAS, same
    dtype), then on vLLM. `cases` picks some (cases=fork,rewind); `vllm`: "auto" runs it when
    its environment exists and the run is not --quick (it takes minutes to start), "on"
    always, "off" never; `size` overrides fields of `sizes` (doc_tokens=2048, ...)."""
    from forkv.engine import blas

    blas.activate()
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from forkv.engine.loader import pick_dtype, resolve_model_path

    if vllm not in ("auto", "on", "off"):
        raise ValueError(f"vllm must be auto, on or off, got {vllm!r}.")
    unknown = set(size) - set(Sizes.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown serve size {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(Sizes.__dataclass_fields__)}.")
    unknown = set(cases) - set(CASES)
    if unknown or not cases:
        raise ValueError(f"Unknown serve case {', '.join(sorted(unknown)) or '(none)'}; choose "
                         f"from {', '.join(CASES)}.")
    sz = replace(sizes or (QUICK if quick else FULL), **size)
    folder = resolve_model_path(model)
    tokenizer = load_tokenizer(folder)
    dtype = pick_dtype("auto", "bfloat16")  # what forkv computes in on this device
    starts = {"forkv": lambda: start_forkv(model),
              "peer": lambda: start_peer(str(folder), dtype)}
    notes = []
    if vllm == "off" or (vllm == "auto" and quick):
        notes.append("No vLLM side: --quick or vllm=off (--set vllm=on starts it).")
    elif (python := vllm_python()) is None:
        if vllm == "on":
            raise ValueError("vllm=on needs vLLM's CPU build in .venv-vllm (or "
                             "FORKV_VLLM_PYTHON); .ci/run shows how to make it.")
        notes.append("No vLLM side: no .venv-vllm (or FORKV_VLLM_PYTHON) with vLLM's CPU "
                     "build; .ci/run makes one.")
    else:
        try:
            view = vllm_view(folder)
            starts["vllm"] = lambda: start_vllm(python, view, name="bench",
                                                max_model_len=16384, kv_space_gib=4,
                                                threads=os.cpu_count())
        except ValueError as e:
            notes.append(f"No vLLM side: {e}")
    sides = {}
    for name, start in starts.items():
        server = start()
        try:
            server.wait_ready(timeout=900)
            sides[name] = [_run_side(server, sz, tokenizer, rep, cases) for rep in range(reps)]
        except RuntimeError as e:
            if name != "vllm":
                raise
            notes.append(f"No vLLM side: {e}"[:2000])  # e.g. its CPU build refuses the model
        finally:
            server.stop()
    return _result(model, sz, reps, dtype, sides, cases, notes)


# headline figure -> (case, field, whose median is the numerator: "peer" or "forkv")
_FIGURES = {"extend_ttft_ratio": ("extend", "later_ttft_s", "forkv"),
            "reasoning_ttft_speedup": ("reasoning", "later_ttft_s", "peer"),
            "ttft_speedup_fork": ("fork", "later_ttft_s", "peer"),
            "ttft_speedup_rewind": ("rewind", "rewind_ttft_s", "peer"),
            "concurrent_throughput_ratio": ("concurrent", "tokens_per_s", "forkv")}


_LABELS = {"forkv": "forkv", "peer": "mlx_lm_server", "vllm": "vllm"}


def _figures(f: list, other: list, ran: tuple[str, ...], suffix: str) -> dict:
    """The headline ratios of forkv's runs `f` against another side's runs."""
    out = {}
    for figure, (case, key, top) in _FIGURES.items():
        if case in ran:
            num, den = (other, f) if top == "peer" else (f, other)
            d = statistics.median(r[case][key] for r in den)
            out[figure + suffix] = round(
                statistics.median(r[case][key] for r in num) / d, 3) if d else 0.0
    return out


def _result(model: str, sz: Sizes, reps: int, dtype: str, sides: dict,
            ran: tuple[str, ...], notes: list[str]) -> dict:
    f = sides["forkv"]
    headline = _figures(f, sides["peer"], ran, "")
    if "vllm" in sides:
        headline.update(_figures(f, sides["vllm"], ran, "_vs_vllm"))
    for name, runs in sides.items():
        headline[f"{name}_peak_rss_mib"] = max(r["peak_rss_mib"] or 0 for r in runs)
    cases = [{"case": case, **{_LABELS[name]: [r[case] for r in runs]
                               for name, runs in sides.items()}}
             for case in CASES if case in ran]
    notes = notes + [
        "Every server is a separate process on loopback, driven by the openai client with "
        "streaming (TTFT = first streamed token); mlx_lm.server runs with forkv's BLAS "
        f"activated before mlx is imported and its weights cast to {dtype}, as forkv computes.",
        "Each side runs every case once per rep with fresh texts, forkv first; the ratios are "
        "medians over the later turns/questions (the first one of a case computes everything "
        "on both sides).",
        "reasoning: the client sends back a short answer instead of the generated text, as a "
        "thinking model's template drops its reasoning from later turns.",
        "Targets hold on the sliding-window and hybrid models (gemma3, qwen3_5); the dense "
        "model is a reference, where mlx-lm can trim its cache back.",
    ] + (["vllm: vLLM's CPU build in its own environment on the same weights (config.json "
          "given the architectures entry it needs), float32, prefix caching, OpenMP threads = "
          "cores, KV space 4 GiB (VLLM_CPU_KVCACHE_SPACE); its peak RSS sums the server's "
          "processes. The *_vs_vllm figures have no targets yet."] if "vllm" in sides else [])
    return result("serve", model, {"sizes": asdict(sz), "reps": reps, "cases": list(ran)},
                  cases, headline, {k: t for k, t in TARGETS.items() if k in headline}, notes,
                  dtype=dtype)
