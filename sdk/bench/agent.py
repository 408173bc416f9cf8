"""`forkv bench agent`: agent workflows on forkv vs plain mlx-lm generation, in one run.

Two workflows, each run by forkv (a `Session` on a fresh checkpoint store per rep) and then
replayed by two baselines (agent_baseline.py), rep by rep:

- branch_prune: system + a long user turn (code to review), then `turns` times: reason at
  length, answer, prune the reasoning (the answer kept verbatim), ask the next question.
- tree_of_thought: a 2K-token prompt, k reasoning branches (short, sampled), the best by mean
  logprob answers.

Both baselines are mlx-lm's `generate_step` with one prompt cache (extended, else trimmed where
the cache allows it, else recomputed), replaying the exact token sequences forkv saw (prompts
and generated tokens, fed as its decode steps). They differ in the model they run:

- mlx_lm, the headline (`speedup`, `prefill_ratio`, `turn_speedup`, `turn_ttft_speedup`,
  `tot_speedup`, `tot_prefill_ratio`): what a user gets without forkv, the same folder loaded
  by `mlx_lm.load` (its weights cast to forkv's dtype, dequantized where forkv dequantizes),
  on mlx's own attention, norms, RoPE and activations. Matmuls run on the BLAS forkv put under
  mlx for the whole process, so forkv's BLAS gain is not in it (`forkv bench blas`).
- no_reuse (`reuse_*`): reuse alone, the replay on forkv's loaded model, whose float attention,
  norms, RoPE and activations run on forkv's kernels: only checkpoint reuse differs.

forkv decodes without speculation (`speculate="off"`), so every side does the same decode work,
one token a step, and the sides differ in prefill (and, for mlx_lm, in kernels). Prefill tokens
are what each side feeds the model for prompts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from .agent_baseline import Replay, Step, load_plain_model, replay
from .common import ascii_only, result, summary

SYSTEM = ("You are a careful senior engineer doing code review. Point out bugs first, then "
          "risky edge cases, then style. Quote the lines you mean. Keep answers short.")
QUESTIONS = ["Good. Now suggest tests for the worst bug.", "Which fix is the riskiest?",
             "Summarise the review in three bullets.", "What would you refactor first?",
             "Any security concerns?", "Rate the module from 1 to 10."]


@dataclass(frozen=True, slots=True)
class Sizes:
    context: int  # tokens of system + first user turn (branch_prune)
    turns: int
    reasoning: int  # tokens per reasoning node
    answer: int  # tokens per final answer
    tot_prompt: int
    tot_k: int
    tot_reasoning: int
    tot_answer: int


# An agent over a long document (a 4K-token module to review) asking short questions: the
# regime where branch-and-prune pays, and where mlx-lm recomputes the document on every prune
# of a sliding-window or hybrid model. Generated tokens cost the same on every side, so longer
# reasoning moves the whole-workflow ratio towards 1, and so does a slow first read (every side
# pays it once): the targets are per turn after a prune, `turn_speedup` (wall time) and
# `turn_ttft_speedup` (time to the turn's first token). One `small` demo model takes about 10
# minutes on 2 busy CPU cores, most of it the two baselines' recomputes (mlx's own attention
# the slower).
FULL = Sizes(context=4096, turns=4, reasoning=32, answer=16, tot_prompt=1990, tot_k=8,
             tot_reasoning=12, tot_answer=12)
QUICK = Sizes(context=300, turns=2, reasoning=12, answer=4, tot_prompt=300, tot_k=3,
              tot_reasoning=4, tot_answer=4)


def _text_of(tokenizer, head: str, num_tokens: int) -> str:
    """`head` plus numbered code lines until the text encodes to about `num_tokens` tokens."""
    lines, i = [head], 0
    while len(tokenizer.encode("".join(lines), add_special_tokens=False)) < num_tokens:
        lines.append(f"def step_{i}(values, k={i}):\n    return [v * k - {i} for v in values]\n")
        i += 1
    return "".join(lines)


# -- forkv ---------------------------------------------------------------------------------------
class _Ours:
    """Times `session.run` per step (rendering the trace's prompt happens outside the clock)."""

    def __init__(self, session):
        self.session = session
        self.wall = 0.0
        self.prefill = self.reused = 0
        self.trace: list[Step] = []
        self.steps: list[dict] = []
        self._index: dict[str, int] = {}  # node id -> its step

    def run(self, nodes: list) -> None:
        prompts = [self.session.prompt(n).token_ids for n in nodes]
        first: dict[str, float] = {}  # node id -> seconds to its first streamed token
        t0 = time.perf_counter()
        for event in self.session.stream(nodes):
            first.setdefault(event.node_id, time.perf_counter() - t0)
        wall = time.perf_counter() - t0
        self.wall += wall
        tokenizer = self.session.engine.lm.tokenizer
        for node, prompt in zip(nodes, prompts):
            st = node.result.stats
            self.prefill += st.tokens_computed
            self.reused += st.tokens_reused
            step = Step(prompt, list(node.result.token_ids))
            if node.parent_id in self._index:  # continues a generation of this trace
                step.parent = self._index[node.parent_id]
                step.parent_text_tokens = len(tokenizer.encode(node.parent.text or "",
                                                               add_special_tokens=False))
            self._index[node.id] = len(self.trace)
            self.trace.append(step)
            self.steps.append({"node": node.id, "kind": node.kind, "prompt": len(prompt),
                               "reused": st.tokens_reused, "computed": st.tokens_computed,
                               "generated": st.tokens_generated, "wall_s": round(wall, 3),
                               "ttft_s": round(first.get(node.id, wall), 4)})


def _session(lm, model: str):
    from forkv import Session
    from forkv.engine import Engine

    # No speculation: a verified draft would decode several tokens in one step, which the
    # replays cannot, and the figures are about prefill.
    return Session(Engine(lm, speculate="off"))


def _gen(lm, model: str, **settings) -> dict:
    """A node's settings; demo models sample ASCII bytes only (see `ascii_only`)."""
    bias = ascii_only(lm, model)
    return {**settings, "logit_bias": bias} if bias else settings


def _branch_prune(lm, model: str, sz: Sizes, doc: str) -> _Ours:
    s = _session(lm, model)
    try:
        ours = _Ours(s)
        user = s.system(SYSTEM).user(doc)
        for t in range(sz.turns):
            reasoning = user.reasoning(_gen(lm, model, max_tokens=sz.reasoning, temperature=0.7,
                                             seed=t))
            answer = reasoning.final(_gen(lm, model, max_tokens=sz.answer))
            ours.run([reasoning])
            ours.run([answer])
            kept = s.tree.prune(answer)  # system -> ... -> user -> answer (verbatim)
            user = kept.user(QUESTIONS[t % len(QUESTIONS)])
        return ours
    finally:
        s.engine.close()


def _tree_of_thought(lm, model: str, sz: Sizes, problem: str) -> _Ours:
    s = _session(lm, model)
    try:
        ours = _Ours(s)
        user = s.system("Think step by step, then answer.").user(problem)
        branches = user.fork(sz.tot_k, gen=_gen(lm, model, max_tokens=sz.tot_reasoning,
                                                temperature=0.8))
        ours.run(branches)
        best = max(branches, key=s.mean_logprob)
        ours.run([best.final(_gen(lm, model, max_tokens=sz.tot_answer))])
        return ours
    finally:
        s.engine.close()


# -- the benchmark -------------------------------------------------------------------------------
_Sides = tuple[_Ours, Replay, Replay]  # forkv, mlx_lm (plain mlx-lm), no_reuse (forkv's kernels)


def _warm_up(lm, model: str, plain) -> str:
    """Run every path once on a short prompt, so first-call costs hit no measurement; returns
    what speculate='auto' would do on this model."""
    s = _session(lm, model)
    try:
        auto = s.engine.speculation("auto") or "would draft and verify"
        node = s.user("warm up " * 40).final(_gen(lm, model, max_tokens=2))
        s.run(node)
        trace = [Step(s.prompt(node.parent).token_ids, list(node.result.token_ids))]
        replay(plain, trace)
        replay(lm.model, trace)
        return auto
    finally:
        s.engine.close()


def run_agent_bench(model: str = "demo:gemma3:small", quick: bool = False,
                    reps: int | None = None, sizes: Sizes | None = None, **size: int) -> dict:
    """Branch-and-prune and tree-of-thought, forkv vs plain mlx-lm (the headline) and vs the
    same replay on forkv's kernels (`reuse_*`), interleaved per rep. `size` overrides fields
    of `sizes` (context=2048, turns=2, ...)."""
    from forkv.engine import load_model

    unknown = set(size) - set(Sizes.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown agent size {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(Sizes.__dataclass_fields__)}.")
    sz = replace(sizes or (QUICK if quick else FULL), **size)
    reps = reps or 1
    lm = load_model(model)
    plain, plain_how = load_plain_model(lm)
    doc = _text_of(lm.tokenizer, "Review this module:\n\n", sz.context)
    problem = _text_of(lm.tokenizer, "Find the bug behind this failing test log:\n",
                       sz.tot_prompt)
    auto = _warm_up(lm, model, plain)
    runs: dict[str, list[_Sides]] = {"branch_prune": [], "tree_of_thought": []}
    for _ in range(reps):
        for name, workflow, text in (("branch_prune", _branch_prune, doc),
                                     ("tree_of_thought", _tree_of_thought, problem)):
            ours = workflow(lm, model, sz, text)
            runs[name].append((ours, replay(plain, ours.trace), replay(lm.model, ours.trace)))
    cases = [_case(name, sides) for name, sides in runs.items()]
    bp, tot = cases
    headline = {"speedup": bp["speedup"], "prefill_ratio": bp["prefill_ratio"],
                "turn_speedup": bp["turn_speedup"], "turn_ttft_speedup": bp["turn_ttft_speedup"],
                "tot_speedup": tot["speedup"], "tot_prefill_ratio": tot["prefill_ratio"],
                "reuse_turn_speedup": bp["reuse_turn_speedup"],
                "reuse_turn_ttft_speedup": bp["reuse_turn_ttft_speedup"],
                "reuse_tot_speedup": tot["reuse_speedup"]}
    # The whole-workflow `speedup` is bound by decode and the first read of the document,
    # which every side pays: a reported figure, not a target.
    settings = {**asdict(sz), "reps": reps, "quick": quick, "block_size": 256,
                "speculate": "off", "speculate_auto": auto, "mlx_lm_model": plain_how,
                "forkv_kernels": lm.quantization_reason}
    return result(
        "agent", model, settings, cases, headline,
        {"turn_speedup": ">= 5", "turn_ttft_speedup": ">= 20", "tot_speedup": ">= 5"},
        notes=[("each baseline: mlx-lm generate_step with one prompt cache (extend, else trim "
                "if trimmable, else recompute), replaying forkv's exact tokens"),
               (f"mlx_lm side (speedup, prefill_ratio, turn_speedup, turn_ttft_speedup, "
                f"tot_speedup, tot_prefill_ratio: mlx-lm ÷ forkv): what a user gets without "
                f"forkv, the model folder loaded by {plain_how}, on mlx's own attention, "
                f"norms, RoPE and activations; forkv's gain from reuse and kernels together "
                f"(matmuls on the BLAS both share here: `forkv bench blas` measures that apart)"),
               ("no_reuse side (reuse_turn_speedup, reuse_turn_ttft_speedup, "
                "reuse_tot_speedup, and each case's reuse_*: no_reuse ÷ forkv): the same "
                "replay on forkv's loaded model, its kernels included; reuse alone"),
               (f"forkv decodes with speculate='off' (auto here: {auto}), so every side "
                "decodes the same tokens one step at a time"),
               ("demo models sample ASCII bytes only, so generated text round-trips through the "
                "tokenizer as a real model's does")],
        dtype=lm.dtype)


def _case(name: str, sides: list[_Sides]) -> dict:
    ours = sides[0][0]
    out = {"workflow": name,
           "forkv": {"wall_s": summary([o.wall for o, _, _ in sides]),
                     "prefill_tokens": ours.prefill, "reused_tokens": ours.reused,
                     "generated_tokens": sum(len(t.generated) for t in ours.trace),
                     "steps": ours.steps}}
    for side, prefix, i in (("mlx_lm", "", 1), ("no_reuse", "reuse_", 2)):
        base = sides[0][i]
        out[side] = {"wall_s": summary([s[i].wall for s in sides]),
                     "prefill_tokens": base.prefill, "steps": base.steps}
        out.update({prefix + k: v for k, v in _figures(name, [(s[0], s[i]) for s in sides])
                    .items()})
    return out


def _figures(name: str, pairs: list[tuple[_Ours, Replay]]) -> dict:
    """Baseline ÷ forkv: whole workflow wall time, prefill tokens and, for branch_prune, the
    per-turn figures."""
    ours_wall = summary([o.wall for o, _ in pairs])["median"]
    base_wall = summary([b.wall for _, b in pairs])["median"]
    ours, base = pairs[0]
    bp = name == "branch_prune"
    return {"speedup": round(base_wall / ours_wall, 2),
            "prefill_ratio": round(base.prefill / max(1, ours.prefill), 2),
            "turn_speedup": _turn_speedup(pairs) if bp else None,
            "turn_ttft_speedup": _turn_ttft_speedup(pairs) if bp else None}


def _turn_speedup(pairs: list[tuple[_Ours, Replay]]) -> float | None:
    """Median over the turns after a prune (reasoning + answer, both sides) of baseline wall
    over ours: what each later turn costs once the document has been read, which both sides
    pay once (the whole-workflow `speedup` includes that first read)."""
    ratios = []
    for ours, base in pairs:
        walls = [(o["wall_s"], b["wall_s"]) for o, b in zip(ours.steps, base.steps)]
        turns = [walls[i:i + 2] for i in range(2, len(walls) - 1, 2)]  # skip the first turn
        ratios += [sum(b for _, b in t) / max(1e-9, sum(o for o, _ in t)) for t in turns]
    return round(summary(ratios)["median"], 2) if ratios else None


def _turn_ttft_speedup(pairs: list[tuple[_Ours, Replay]]) -> float | None:
    """Median over the turns after a prune of baseline ÷ ours time to the first token of the
    turn (its reasoning step): what a user waits before a later turn starts to stream."""
    ratios = []
    for ours, base in pairs:
        firsts = [(o["ttft_s"], b["ttft_s"]) for o, b in zip(ours.steps, base.steps)]
        ratios += [b / max(1e-9, o) for o, b in firsts[2::2]]  # each later turn's reasoning
    return round(summary(ratios)["median"], 2) if ratios else None
