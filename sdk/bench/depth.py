"""`forkv bench depth`: what one agent turn costs as a linear conversation grows.

A system prompt, then `turns` times: a user message of about `user_tokens` tokens, a final
answer of `answer_tokens` tokens (greedy). Each turn is one `session.run(answer)`, timed whole
(`wall_ms`) and split into the engine's part (`engine_ms`: from submit to the last token, as
the engine times it) and the SDK's (`sdk_ms`: rendering the prompt, block and turn keys,
attaching the result - the rest of the wall time); `model_ms` is the model's own prefill and
decode time, `overhead_ms` the wall time less that. A turn should cost its own tokens, not the
path above it (`depth_ratio`: the median wall time of the last five turns over that of turns
8-12; `overhead_depth_ratio` the same for `overhead_ms`). On a tiny demo model the weights cost
next to nothing, so what grows is the machinery around the model and attention, the one cost
that grows by nature (each new token attends to the whole context).
"""

from __future__ import annotations

import statistics
import time

from .common import ascii_only, result

# Short asks, cycled, padded to the size asked for with numbered items.
_ASKS = ["Check the next log line and say whether it is an error", "Summarise what changed",
         "Which function handles the retry", "Is the timeout too short here", "List the inputs"]


def _user_text(tokenizer, turn: int, num_tokens: int) -> str:
    text = f"Turn {turn}: {_ASKS[turn % len(_ASKS)]}."
    while len(tokenizer.encode(text, add_special_tokens=False)) < num_tokens:
        text += f" item {turn}.{len(text) % 97}"
    return text


_MS = ("wall_ms", "engine_ms", "sdk_ms", "model_ms", "overhead_ms", "restore_ms")


def _median_ms(rows: list[dict], key: str, turns: range) -> float | None:
    vals = [r[key] for r in rows if r["turn"] in turns]
    return round(statistics.median(vals), 1) if vals else None


def run_depth_bench(model: str = "demo:qwen3:tiny", quick: bool = False,
                    reps: int | None = None, turns: int = 80, user_tokens: int = 45,
                    answer_tokens: int = 4, serve: bool = True, serve_turns: int = 60) -> dict:
    """One linear conversation of `turns` turns; per-turn wall, engine and SDK milliseconds.
    `reps` conversations (default 1) give each turn's median. With `serve`, also a
    `serve_turns`-turn conversation through the Responses API of a real `forkv serve` vs
    through Session, and a short chat's time to first token beside it (depth_serve.py)."""
    from forkv import Session
    from forkv.engine import Engine, load_model

    turns = 16 if quick else turns
    reps = reps or 1
    lm = load_model(model)
    is_demo = model.startswith("demo:")
    per_rep: list[list[dict]] = []
    for rep in range(reps + 1):  # rep 0 warms up (first-call costs), and is dropped
        s = Session(Engine(lm))
        try:
            gen = {"max_tokens": answer_tokens, "logit_bias": ascii_only(lm, model)}
            node = s.system("You are a terse assistant. Answer in a word or two.")
            rows = []
            for t in range(1, (turns if rep else 3) + 1):
                answer = node.user(_user_text(lm.tokenizer, t, user_tokens)).final(gen)
                t0 = time.perf_counter()
                s.run(answer)
                wall = time.perf_counter() - t0
                tm = answer.result.timings
                engine = tm.get("first_token_s", 0.0) + tm.get("decode_s", 0.0)
                compute = tm.get("prefill_s", 0.0) + tm.get("decode_s", 0.0)
                rows.append({"turn": t, "prompt_tokens": int(tm.get("prompt_tokens", 0)),
                             "reused": int(tm.get("reused_tokens", 0)),
                             "computed": int(tm.get("computed_tokens", 0)),
                             "wall_ms": round(wall * 1e3, 1), "engine_ms": round(engine * 1e3, 1),
                             "sdk_ms": round((wall - engine) * 1e3, 1),
                             "model_ms": round(compute * 1e3, 1),
                             "restore_ms": round(tm.get("restore_s", 0.0) * 1e3, 1),
                             "overhead_ms": round((wall - compute) * 1e3, 1)})
                node = answer
        finally:
            s.close()
        if rep:
            per_rep.append(rows)
    curve = [{**rows[0], **{k: round(statistics.median(r[i][k] for r in per_rep), 1)
                            for k in _MS}}
             for i, rows in enumerate(zip(*per_rep))]
    early = range(8, 13)
    late = range(turns - 4, turns + 1)
    headline = {f"turn_{t}_ms": curve[t - 1]["wall_ms"] for t in (1, 10, turns // 2, turns)
                if t <= turns}
    for name, key in (("depth_ratio", "wall_ms"), ("overhead_depth_ratio", "overhead_ms"),
                      ("model_depth_ratio", "model_ms")):
        a, b = _median_ms(curve, key, early), _median_ms(curve, key, late)
        headline[name] = round(b / a, 2) if a and b else None
    for key in _MS[1:]:
        headline[f"early_{key}"] = _median_ms(curve, key, early)
        headline[f"late_{key}"] = _median_ms(curve, key, late)
    cases = [{"case": "linear", "curve": curve}]
    targets = {"depth_ratio": "<= 1.5", "overhead_depth_ratio": "<= 1.5"}
    if serve:
        from .depth_serve import run_server_cases

        figures, more = run_server_cases(model, 8 if quick else serve_turns,
                                         3 if quick else 20)
        headline.update(figures)
        cases += more
        targets.update({"responses_vs_session": "<= 1.3", "ttft_under_chain_ratio": "<= 1.5"})
    return result(
        "depth", model, {"turns": turns, "user_tokens": user_tokens,
                         "answer_tokens": answer_tokens, "reps": reps, "quick": quick,
                         "serve": serve, "serve_turns": serve_turns},
        cases, headline, targets,
        notes=[(f"*_depth_ratio: the median of turns {late.start}-{late.stop - 1} over that "
                f"of turns {early.start}-{early.stop - 1}"),
               ("engine_ms: the engine's first_token_s + decode_s (submit to last token); "
                "sdk_ms: the rest of the turn's wall time (render, keys, attach)"),
               ("model_ms: the model's own prefill + decode time (prefill_s + decode_s): the "
                "new tokens' attention over the whole context grows with depth by nature; "
                "overhead_ms: wall minus model_ms, what the machinery around the model costs")]
        + ([("responses_vs_session: the median wall ms of the last 5 turns of one "
             "conversation (user turns 'Question i: ' + 'word ' * 40, 4 tokens out, greedy) "
             "through the Responses API (forkv serve --reasoning off --reuse exact, openai "
             "client) over "
             "the same through Session, in one run; ttft_under_chain_ratio: a short streamed "
             "chat's median time to first token while another client runs that chain, over "
             "its median on the idle server (before and after)")] if serve else [])
        + (["demo models sample ASCII bytes only (a logit bias)"] if is_demo else []),
        dtype=lm.dtype)
