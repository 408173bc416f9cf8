"""`forkv bench serve`: the same conversations, sent with the `openai` client, to `forkv serve`
and to its peers on the same model, side by side in one run: mlx-lm's own `mlx_lm.server` on
the same folder; vLLM's CPU build where it is installed (see `cluster_vllm`); llama.cpp's
`llama-server` on the same GGUF, at its defaults and tuned for reuse (see `llamacpp`), where
the model is a GGUF (the default `gemma3-270m` is) and a llama-server is built.

The cases are in `serve_cases` (each side gets the same requests, greedy; forkv first):
extend, reasoning, fork, rewind and concurrent as before; alternate (more conversations than
a server has slots, round robin), deep_rewind (a long agent trajectory, then back to each
earlier turn), prune (think, drop the thinking, answer), tree (k sampled branches of one
prompt at once), tenants (clients under one cache_salt, then each under its own), kernels
(prefill and decode speed with nothing to reuse) and long (one 32K-token prompt decoding 256
tokens, then a fork and a rewind at 32K: forkv and llama-server only, each side in a fresh
process of its own, both also with q8_0 K/V (forkv's `--kv-bits 8`), so each one's peak RSS
is this case's; it runs after every side's other cases, rep by rep, the sides taking turns).

Headline figures against mlx_lm.server keep their names (`ttft_speedup_fork`, ...); against
vLLM they end in `_vs_vllm`; against llama-server `ttft_ratio_<case>_vs_llamacpp` (forkv ÷
llama-server, every case), `computed_ratio_vs_llamacpp` (the largest forkv ÷ llama-server
prompt tokens computed over the cases), `ttft_speedup_deep_rewind_vs_llamacpp` (llama-server
÷ forkv over the rewinds where llama-server had no checkpoint at the branch point and
recomputed part of the conversation before it), `prefill_kernel_ratio` (the long prompt),
`prefill_short_kernel_ratio` (512 tokens) and `decode_kernel_ratio`; the tuned
llama-server's end in `_vs_llamacpp_tuned`. The long case's `long_rss_vs_llamacpp`,
`long_prefill_vs_llamacpp` and `long_decode_vs_llamacpp` are forkv ÷ llama-server's peak RSS,
prefill and decode tok/s (`_vs_llamacpp_q8`: against its q8_0 K/V; `long_*_q8_vs_llamacpp_q8`:
forkv's q8_0 K/V against it). Knows the sides and the
figures; the processes are in `serve_procs`, `cluster_vllm` and `llamacpp`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .cluster_vllm import start_vllm, vllm_python, vllm_view
from .common import result
from .llamacpp import (
    LlamaServerMissing,
    gguf_of,
    llama_server_path,
    repack_crashes,
    start_llama_server,
)
from .serve_cases import CASES, FULL, QUICK, Client, Sizes, case_clients, long_context, run_case
from .serve_procs import ServerProcess, start_forkv, start_peer, timed_chat

__all__ = ["CASES", "FULL", "QUICK", "Sizes", "run_serve_bench"]

TARGETS = {"extend_ttft_ratio": "<= 1.1", "ttft_speedup_fork": ">= 20",
           "ttft_speedup_rewind": ">= 5", "concurrent_throughput_ratio": ">= 1.5",
           "computed_ratio_vs_llamacpp": "<= 1", "ttft_speedup_deep_rewind_vs_llamacpp": ">= 20",
           "tenant_throughput_ratio": ">= 0.9", "llamacpp_ok": "== true",
           "long_rss_vs_llamacpp": "<= 1.2", "long_prefill_vs_llamacpp": ">= 1.0",
           "long_decode_vs_llamacpp": ">= 1.0", "long_rss_q8_vs_llamacpp_q8": "<= 1.0"}


@dataclass(slots=True)
class _Side:
    # the case's clients (a tuned peer's slots) -> server; None: the side runs the long case only
    start: Callable[[int], ServerProcess] | None
    per_case: bool = False  # a fresh server for every case, sized to it
    takes_n: bool = True  # samples n choices of one prompt
    optional: bool = False  # a failure is a note, not an error
    # context tokens -> a fresh server for the long case alone; None: no long case
    start_long: Callable[[int], ServerProcess] | None = None
    kv_dtype: str | None = None  # the K/V format the side is about (checked: forkv's card)

    def cases(self, cases: tuple[str, ...]) -> tuple[str, ...]:
        """Those of `cases` this side runs."""
        return tuple(c for c in cases
                     if (self.start_long if c == "long" else self.start) is not None)


def run_serve_bench(model: str = "gemma3-270m", quick: bool = False, reps: int = 1,
                    cases: tuple[str, ...] = tuple(CASES), vllm: str = "auto",
                    llamacpp: str = "auto", exact: str = "on", drift: str = "auto",
                    mlx_lm: str = "on",
                    sizes: Sizes | None = None, **size: int) -> dict:
    """Each case on `forkv serve`, then on `mlx_lm.server` (same folder, same BLAS, same
    dtype), vLLM and llama-server (defaults, then tuned). `cases` picks some
    (cases=fork,deep_rewind); `vllm`/`llamacpp`: "auto" runs it when it is installed (built)
    and the run is not --quick, "on" always (llamacpp=on builds llama-server if needed),
    "off" never; `exact` ("on"/"off") also runs `forkv serve --reuse exact` (the server's
    default is fast reuse); `mlx_lm` ("on"/"off") the mlx_lm.server side; `drift`
    ("auto": unless --quick) measures fast reuse's logits
    against exact reuse's in this process (reuse_drift.py); `size` overrides fields of `sizes`
    (doc_tokens=2048, ...)."""
    from forkv.engine.models import blas

    blas.activate()
    from forkv.engine.models.loader import pick_dtype, resolve_model_path
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    for name, value in (("vllm", vllm), ("llamacpp", llamacpp)):
        if value not in ("auto", "on", "off"):
            raise ValueError(f"{name} must be auto, on or off, got {value!r}.")
    for name, value in (("exact", exact), ("mlx_lm", mlx_lm)):
        if value not in ("on", "off"):
            raise ValueError(f"{name} must be on or off, got {value!r}.")
    if drift not in ("auto", "on", "off"):
        raise ValueError(f"drift must be auto, on or off, got {drift!r}.")
    unknown = set(size) - set(Sizes.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown serve size {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(Sizes.__dataclass_fields__)}.")
    unknown = set(cases) - set(CASES)
    if unknown or not cases:
        raise ValueError(f"Unknown serve case {', '.join(sorted(unknown)) or '(none)'}; choose "
                         f"from {', '.join(CASES)}.")
    cases = tuple(c for c in CASES if c in cases)
    sz = replace(sizes or (QUICK if quick else FULL), **size)
    notes: list[str] = []
    llama = _llama_setup(model, llamacpp, quick, notes)  # before any server: a clear error
    folder = resolve_model_path(model)
    tokenizer = load_tokenizer(folder)
    config = json.loads((Path(folder) / "config.json").read_text())
    dtype = pick_dtype("auto", "bfloat16")  # what forkv computes in on this device
    sides = {"forkv": _Side(lambda _: start_forkv(model), start_long=lambda _: start_forkv(model))}
    if "long" in cases:  # forkv's K/V at half its default bytes (--kv-bits 8)
        sides["forkv_q8"] = _Side(None, optional=True, kv_dtype="q8_0",
                                  start_long=lambda _: start_forkv(model, kv_dtype="q8_0"))
    if exact == "on":
        sides["forkv_exact"] = _Side(lambda _: start_forkv(model, "exact"))
    if mlx_lm == "on":
        sides["peer"] = _Side(lambda _: start_peer(str(folder), dtype), takes_n=False)
    else:
        notes.append("No mlx_lm.server side (mlx_lm=off): its figures are left out.")
    _add_vllm(sides, vllm, quick, folder, config, notes)
    if llama is not None:
        binary, gguf, template = llama
        # (its 4 default slots refuse n > 4: the tree case sends its branches as requests)
        sides["llamacpp"] = _Side(
            lambda _: start_llama_server(binary, gguf, chat_template=template), takes_n=False,
            optional=True, start_long=lambda ctx: start_llama_server(
                binary, gguf, chat_template=template, context=ctx))
        sides["llamacpp_tuned"] = _Side(
            lambda slots: start_llama_server(binary, gguf, chat_template=template, tuned=True,
                                             slots=slots), per_case=True, optional=True)
        if "long" in cases:  # llama-server's K/V at half its default bytes, as a second peer
            sides["llamacpp_q8"] = _Side(None, optional=True, start_long=lambda ctx: (
                start_llama_server(binary, gguf, chat_template=template, context=ctx,
                                   kv_type="q8_0")))
    no_eos = {str(i): -100.0 for i in sorted(_eos_ids(tokenizer, config))}
    runs, failed = {}, set()
    for name, side in sides.items():
        rest = tuple(c for c in side.cases(cases) if c != "long")
        if not rest:  # none, or only the long case (below)
            continue
        try:
            runs[name] = _run_side(side, sz, tokenizer, reps, rest, no_eos)
        except Exception as e:
            if not side.optional:
                raise
            notes.append(f"No {name} side: {type(e).__name__}: {e}"[:2000])
            failed.add(name)
    if "long" in cases:
        _run_long({n: side for n, side in sides.items()
                   if side.start_long is not None and n not in failed},
                  runs, sz, tokenizer, reps, no_eos, notes)
    if llama is not None and _repack_crashed(llama[0], llama[1]):
        notes.append("llama-server segfaults at start with weight repacking on this CPU, so "
                     "both llama-server sides ran with --no-repack.")
    headline_extra = {"llamacpp_ok": None if llama is None else "llamacpp" in runs}
    if drift == "on" or (drift == "auto" and not quick):
        from .reuse_drift import measure_drift

        d = measure_drift(model)
        headline_extra.update(fast_max_abs_dlogit=d["fast_max_abs_dlogit"],
                              fast_greedy_agreement=d["fast_greedy_agreement"])
        notes.append("Fast reuse's drift (reuse_drift.py, in the bench process, "
                     f"{d['dtype']}): fast vs exact logits of a second prompt continued from "
                     "a live cache, 32 positions teacher-forced per case: " + "; ".join(
                         f"{r['case']}: {r.get('live_tokens')} of {r['prompt_tokens']} tokens "
                         f"live, max |dlogit| {r.get('max_abs_dlogit')}, greedy agreement "
                         f"{r.get('greedy_agreement')}" for r in d["cases"]))
    return _result(model, sz, reps, dtype, runs, cases, notes, headline_extra)


def _eos_ids(tokenizer, config: dict) -> set[int]:
    eos = config.get("eos_token_id")
    ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    return ids | ({eos} if isinstance(eos, int) else set(eos or []))


def _add_vllm(sides: dict, vllm: str, quick: bool, folder, config: dict, notes: list) -> None:
    if vllm == "off" or (vllm == "auto" and quick):
        notes.append("No vLLM side: --quick or vllm=off (--set vllm=on starts it).")
        return
    python = vllm_python()
    if python is None:
        if vllm == "on":
            raise ValueError("vllm=on needs vLLM's CPU build in .venv-vllm (or "
                             "FORKV_VLLM_PYTHON); .ci/run shows how to make it.")
        notes.append("No vLLM side: no .venv-vllm (or FORKV_VLLM_PYTHON) with vLLM's CPU "
                     "build; .ci/run makes one.")
        return
    try:
        view = vllm_view(folder)
    except ValueError as e:
        notes.append(f"No vLLM side: {e}")
        return
    max_len = min(32768, config.get("max_position_embeddings") or 16384)
    sides["vllm"] = _Side(lambda _: start_vllm(python, view, name="bench", max_model_len=max_len,
                                               kv_space_gib=4, threads=os.cpu_count()),
                          optional=True)


def _llama_setup(model: str, llamacpp: str, quick: bool, notes: list):
    """(binary, gguf, chat template) for the llama-server sides, or None with a note."""
    if llamacpp == "off" or (llamacpp == "auto" and quick):
        notes.append("No llama-server side: --quick or llamacpp=off (--set llamacpp=on "
                     "starts it, building it first if needed).")
        return None
    gguf = gguf_of(model)
    if gguf is None:
        if llamacpp == "on":
            raise ValueError(f"llamacpp=on needs a GGUF model (gemma3-270m or a .gguf file); "
                             f"{model!r} is not one.")
        notes.append(f"No llama-server side: {model} is not a GGUF (demo models have none).")
        return None
    try:
        binary = llama_server_path(build=llamacpp == "on")
    except LlamaServerMissing as e:
        if llamacpp == "on":
            raise
        notes.append(f"No llama-server side: {e}"[:2000])
        return None
    return binary, *gguf


def _run_long(sides: dict, runs: dict, sz: Sizes, tokenizer, reps: int, no_eos: dict,
              notes: list) -> None:
    """The long case on each of `sides`, every time in a fresh server of its own whose peak
    RSS is the case's, into `runs`: rep by rep, the sides taking turns (in order in even reps,
    reversed in odd ones), so that this machine's drift over the minutes one 32K prefill takes
    falls on every side alike. An optional side that fails loses its long case (a note says
    why); its other cases stand."""
    failed: set[str] = set()
    names = list(sides)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            side = sides[name]
            if name in failed:
                continue
            try:
                got, peak = _fresh(side.start_long(long_context(sz)), side, sz, tokenizer, rep,
                                   "long", no_eos)
            except Exception as e:
                if not side.optional:
                    raise
                notes.append(f"No {name} long case: {type(e).__name__}: {e}"[:2000])
                failed.add(name)
                continue
            got["long"]["peak_rss_mib"] = peak
            run = runs.setdefault(name, [{} for _ in range(reps)])[rep]
            run.update(got, peak_rss_mib=max(run.get("peak_rss_mib") or 0, peak or 0))
    for name in failed & set(runs):
        if not any(set(r) - {"long", "peak_rss_mib"} for r in runs[name]):
            del runs[name]  # it ran nothing else
            continue
        for run in runs[name]:
            run.pop("long", None)


def _run_side(side: _Side, sz: Sizes, tokenizer, reps: int, cases: tuple[str, ...],
              no_eos: dict) -> list[dict]:
    """Every rep's case results and peak RSS on one side (not the long case: _run_long)."""
    rest = tuple(c for c in cases if c != "long")
    if not rest:
        return []
    if not side.per_case:
        server = side.start(1)
        try:
            server.wait_ready(timeout=900)
            runs = [dict(_cases(server, side, sz, tokenizer, rep, rest, no_eos),
                         peak_rss_mib=server.peak_rss_mib()) for rep in range(reps)]
        finally:
            server.stop()
    else:
        runs = []
        for rep in range(reps):
            out, rss = {}, []
            for case in rest:
                got, peak = _fresh(side.start(case_clients(case, sz)), side, sz, tokenizer, rep,
                                   case, no_eos)
                out.update(got)
                rss.append(peak or 0)
            runs.append(dict(out, peak_rss_mib=max(rss)))
    return runs


def _fresh(server: ServerProcess, side: _Side, sz: Sizes, tokenizer, rep: int, case: str,
           no_eos: dict) -> tuple[dict, float | None]:
    """One case on a server started for it alone; its results and the server's peak RSS."""
    try:
        server.wait_ready(timeout=900)
        _check_kv(server, side)
        return _cases(server, side, sz, tokenizer, rep, (case,), no_eos), server.peak_rss_mib()
    finally:
        server.stop()


def _check_kv(server: ServerProcess, side: _Side) -> None:
    """Raise unless the server caches K/V in the side's format (a model whose head_dim is not
    whole groups of 32 gets float16 under --kv-bits 8: its figures would be float16's)."""
    if side.kv_dtype is None:
        return
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
    got = getattr(client.models.retrieve(server.model), "kv_dtype", None)
    if got != side.kv_dtype:
        raise RuntimeError(f"{server.name} caches this model's K/V in {got}, not "
                           f"{side.kv_dtype} (see its log): its figures would not be "
                           f"{side.kv_dtype}'s")


def _cases(server: ServerProcess, side: _Side, sz: Sizes, tokenizer, rep: int,
           cases: tuple[str, ...], no_eos: dict) -> dict:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0,
                           timeout=3600)
    timed_chat(client, server.model, [{"role": "user", "content": "warm up"}], 2)  # compile
    c = Client(client, server.model, takes_n=side.takes_n, no_eos=no_eos)
    out = {}
    for name in cases:
        out[name] = run_case(c, name, sz, tokenizer, rep)
        print(f"  {server.name}: {name} {out[name]['case_wall_s']} s", file=sys.stderr,
              flush=True)  # a full run takes many minutes: show where it is
    return out


# headline figure -> (case, field, whose median is the numerator: "peer" or "forkv")
_FIGURES = {"extend_ttft_ratio": ("extend", "later_ttft_s", "forkv"),
            "reasoning_ttft_speedup": ("reasoning", "later_ttft_s", "peer"),
            "ttft_speedup_fork": ("fork", "later_ttft_s", "peer"),
            "ttft_speedup_rewind": ("rewind", "rewind_ttft_s", "peer"),
            "concurrent_throughput_ratio": ("concurrent", "tokens_per_s", "forkv"),
            "alternate_ttft_speedup": ("alternate", "ttft_median_s", "peer"),
            "ttft_speedup_deep_rewind": ("deep_rewind", "ttft_median_s", "peer"),
            "prune_ttft_speedup": ("prune", "ttft_median_s", "peer"),
            "tree_throughput_ratio": ("tree", "tokens_per_s", "forkv")}
_THROUGHPUT = ("concurrent_throughput_ratio", "tree_throughput_ratio")
_LABELS = {"forkv": "forkv", "forkv_exact": "forkv_exact", "forkv_q8": "forkv_q8",
           "peer": "mlx_lm_server", "vllm": "vllm", "llamacpp": "llama_server",
           "llamacpp_tuned": "llama_server_tuned", "llamacpp_q8": "llama_server_q8"}
# long case figure -> its field: forkv ÷ the llama-server side's (peak RSS: their maxima)
_LONG = {"long_rss": "peak_rss_mib", "long_prefill": "prefill_tokens_per_s",
         "long_decode": "decode_tokens_per_s"}
# A rewind where the server had no checkpoint at the branch point: it restored less than this
# share of the prompt (llama-server falls back to an earlier checkpoint, often a turn back).
_NO_CHECKPOINT = 0.9


def _med(runs: list[dict], case: str, key: str) -> float:
    return statistics.median(r[case][key] for r in runs)


def _ratio(num: float, den: float) -> float:
    return round(num / den, 3) if den else 0.0


def _both(f: list, other: list, ran: tuple[str, ...]) -> tuple[str, ...]:
    """The cases of `ran` that both sides ran (the long case runs on some sides only)."""
    return tuple(c for c in ran if c in f[0] and c in other[0])


def _figures(f: list, other: list, ran: tuple[str, ...], suffix: str,
             names=tuple(_FIGURES)) -> dict:
    """The headline ratios of forkv's runs `f` against another side's runs."""
    ran, out = _both(f, other, ran), {}
    for figure in names:
        case, key, top = _FIGURES[figure]
        if case in ran:
            num, den = (other, f) if top == "peer" else (f, other)
            out[figure + suffix] = _ratio(_med(num, case, key), _med(den, case, key))
    return out


def _llama_figures(f: list, other: list, ran: tuple[str, ...], suffix: str) -> dict:
    ran = _both(f, other, ran)
    if not ran:
        return {}
    out = _figures(f, other, ran, suffix, _THROUGHPUT)
    for case in ran:
        out[f"ttft_ratio_{case}{suffix}"] = _ratio(_med(f, case, "ttft_median_s"),
                                                   _med(other, case, "ttft_median_s"))
    key = {c: "compared_computed_tokens" if "compared_computed_tokens" in f[0][c]
           else "computed_tokens" for c in ran}  # tenants: the part a peer without salts runs
    computed = [_ratio(_med(f, c, key[c]), _med(other, c, key[c]))
                for c in ran if _med(other, c, key[c])]
    out[f"computed_ratio{suffix}"] = max(computed) if computed else None
    if "deep_rewind" in ran:  # by rep and k: llama-server ÷ forkv where it had no checkpoint
        pairs = [o["ttft_s"] / m["ttft_s"] for fr, orr in zip(f, other, strict=True)
                 for m, o in zip(fr["deep_rewind"]["rewinds"], orr["deep_rewind"]["rewinds"],
                                 strict=True)
                 if (o["cached_tokens"] or 0) < _NO_CHECKPOINT * (o["prompt_tokens"] or 0)]
        out[f"ttft_speedup_deep_rewind{suffix}"] = round(statistics.median(pairs), 3) \
            if pairs else None
    if "long" in ran:
        out.update(_long_figures(f, other, suffix))
    return out


def _long_figures(f: list, other: list, suffix: str) -> dict:
    """The long case's figures (_LONG) of runs `f` against `other`'s."""
    out = {}
    for figure, key in _LONG.items():
        pick = max if key == "peak_rss_mib" else statistics.median
        num, den = (pick(r["long"][key] or 0 for r in runs) for runs in (f, other))
        # (no /proc, no peak RSS: no figure, rather than a ratio of zeros)
        out[figure + suffix] = _ratio(num, den) if num and den else None
    return out


def _summary(runs: list[dict], case: str) -> dict:
    """A side's medians over reps of the figures every case reports."""
    keys = ("ttft_median_s", "prompt_tokens", "computed_tokens", "cached_tokens_total",
            "tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_rss_mib")
    return {k: round(_med(runs, case, k), 4) for k in keys
            if all(r[case].get(k) is not None for r in runs)}


def _result(model: str, sz: Sizes, reps: int, dtype: str, sides: dict,
            ran: tuple[str, ...], notes: list[str], extra: dict | None = None) -> dict:
    f = sides["forkv"]
    headline = _figures(f, sides["peer"], ran, "") if "peer" in sides else {}
    if "vllm" in sides:
        headline.update(_figures(f, sides["vllm"], ran, "_vs_vllm"))
    for name in ("llamacpp", "llamacpp_tuned", "llamacpp_q8"):
        if name in sides:
            headline.update(_llama_figures(f, sides[name], ran, "_vs_" + name))
            if "forkv_exact" in sides:  # the same figures for `forkv serve --reuse exact`
                headline.update({"exact_" + k: v for k, v in _llama_figures(
                    sides["forkv_exact"], sides[name], ran, "_vs_" + name).items()})
    if all("long" in sides.get(n, [{}])[0] for n in ("forkv_q8", "llamacpp_q8")):
        headline.update(_long_figures(sides["forkv_q8"], sides["llamacpp_q8"],
                                      "_q8_vs_llamacpp_q8"))  # q8_0 K/V on both sides
    if "forkv_exact" in sides:  # exact ÷ fast TTFT per case: what fast reuse buys
        for case in _both(f, sides["forkv_exact"], ran):
            headline[f"fast_ttft_speedup_{case}"] = _ratio(
                _med(sides["forkv_exact"], case, "ttft_median_s"), _med(f, case, "ttft_median_s"))
    if "kernels" in ran and "llamacpp" in sides:
        for kind in ("prefill", "prefill_short", "decode"):
            key = f"{kind}_tokens_per_s"
            headline[f"{kind}_kernel_ratio"] = _ratio(_med(f, "kernels", key),
                                                      _med(sides["llamacpp"], "kernels", key))
    if "tenants" in ran:
        salted = _med(f, "tenants", "tokens_per_s_salted")
        headline["tenant_throughput_ratio"] = _ratio(salted,
                                                     _med(f, "tenants", "tokens_per_s_one_salt"))
        if "peer" in sides:
            headline["tenant_throughput_vs_shared_mlx_lm"] = _ratio(
                salted, _med(sides["peer"], "tenants", "tokens_per_s_salted"))
    headline.update({k: v for k, v in (extra or {}).items() if v is not None})
    for name, runs in sides.items():
        headline[f"{name}_peak_rss_mib"] = max(r["peak_rss_mib"] or 0 for r in runs)
        if "long" in runs[0]:  # the long case's own server (the figure above: every server)
            headline[f"{name}_long_peak_rss_mib"] = max(r["long"]["peak_rss_mib"] or 0
                                                        for r in runs)
    cases = [{"case": case, "summary": {_LABELS[n]: _summary(runs, case)
                                        for n, runs in sides.items() if case in runs[0]},
              **{_LABELS[n]: [r[case] for r in runs] for n, runs in sides.items()
                 if case in runs[0]}}
             for case in CASES if case in ran]
    return result("serve", model, {"sizes": asdict(sz), "reps": reps, "cases": list(ran)},
                  cases, headline, {k: t for k, t in TARGETS.items() if k in headline},
                  notes + _notes(dtype, sides, ran, sz), dtype=dtype)


def _notes(dtype: str, sides: dict, ran: tuple[str, ...] = (), sz: Sizes = FULL) -> list[str]:
    out = [
        ("Every server is a separate process on loopback, driven by the openai client with "
         "streaming (TTFT = first streamed token); mlx_lm.server runs with forkv's BLAS "
         f"activated before mlx is imported and its weights cast to {dtype}, as forkv computes."),
        ("Each side runs every case once per rep with fresh texts, forkv first; the ratios are "
         "medians over the later turns/questions (the first one of a case computes everything "
         "on both sides)."),
        ("reasoning: the client sends back a short answer instead of the generated text, as a "
         "thinking model's template drops its reasoning from later turns."),
        ("Targets hold on the sliding-window and hybrid models (gemma3, qwen3_5); the dense "
         "model is a reference, where mlx-lm can trim its cache back."),
        ("Prompt tokens computed: prompt_tokens - usage.prompt_tokens_details.cached_tokens; "
         "llama-server's timings.prompt_n. tenants compares its one-salt part with the peers "
         "(they have no cache_salt and share everything); tenant_throughput_ratio is forkv "
         "with a salt per client ÷ forkv with one salt. tok/s in the concurrent, tree, "
         "tenants and kernels cases suppress end-of-sequence tokens (logit_bias)."),
        ("The alternate, deep_rewind, prune and tree figures have no targets yet: the first "
         "measurement on a quiet machine sets them."),
    ]
    if "vllm" in sides:
        out.append("vllm: vLLM's CPU build in its own environment on the same weights "
                   "(config.json given the architectures entry it needs), float32, prefix "
                   "caching, OpenMP threads = cores, KV space 4 GiB (VLLM_CPU_KVCACHE_SPACE); "
                   "its peak RSS sums the server's processes. The *_vs_vllm figures have no "
                   "targets yet.")
    if "llamacpp" in sides or "llamacpp_tuned" in sides:
        out.append("llama-server: llama.cpp's server from the llama-cpp-python sdist on the "
                   "same GGUF (its quantized weights; forkv dequantizes them), threads = cores, "
                   "forkv's chat template; llamacpp = its defaults (4 slots, unified KV, "
                   "context checkpoints every 8192 tokens), llamacpp_tuned = one slot per "
                   "client of the case (alternate: per conversation), unified KV, 64 context "
                   "checkpoints 256 tokens apart, full-size sliding-window caches, a 16 GiB "
                   "prompt cache, restarted per case. Kernel ratios: forkv's prefill "
                   "(computed tokens ÷ TTFT) and decode (client clock) ÷ llama-server's "
                   "timings.prompt_per_second and predicted_per_second. "
                   "ttft_speedup_deep_rewind_vs_llamacpp: the median, over the rewinds where "
                   "llama-server restored under 90% of the prompt (no checkpoint at turn k), "
                   "of its TTFT ÷ forkv's on the same rewind.")
    if "long" in ran:
        out.append(
            f"long: one prompt of {sz.long_tokens:,} tokens of text and a question (no system "
            f"message) decoding {sz.long_decode_tokens} tokens with end-of-sequence suppressed, "
            "then a fork (the same text, another question) and a rewind (back to the first "
            "branch after the fork: its answer and a new question). It runs on forkv serve "
            "(its defaults: fast reuse, float16 K/V; and --kv-bits 8: forkv_q8) and "
            "llama-server (its default f16 K/V, and -ctk q8_0 -ctv q8_0: llamacpp_q8), not on "
            "the other sides; on each in a fresh server process of its own after every side's "
            "other cases, rep by rep with the sides taking turns (reversed in odd reps), "
            "llama-server with one "
            f"slot and -c {long_context(sz):,} (its other defaults: context checkpoints, "
            "prompt cache). Peak RSS: VmHWM of /proc/PID/status, the server process's plus "
            "any live descendants', read after the case, before the server stops (forkv serve "
            "is one process); <side>_long_peak_rss_mib is that server's, "
            "<side>_peak_rss_mib the largest of the side's servers. Prefill tok/s: "
            "llama-server's timings.prompt_per_second, forkv's computed prompt tokens ÷ TTFT "
            "on the client's clock (HTTP, chat template and tokenizing included); decode "
            "tok/s: timings.predicted_per_second, forkv's client clock after the first token. "
            "long_*_vs_llamacpp[_q8] = forkv ÷ llama-server (RSS: lower is better); "
            "long_*_q8_vs_llamacpp_q8 = forkv_q8 ÷ llamacpp_q8.")
    return out


def _repack_crashed(binary, gguf) -> bool:
    try:
        return repack_crashes(binary, gguf)
    except RuntimeError:  # it did not start for another reason: its sides' notes say why
        return False
