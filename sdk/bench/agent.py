"""`forkv bench agent`: agent workflows on forkv vs plain mlx-lm generation, in one run.

Two workflows, each run by forkv (a `Session` on a fresh checkpoint store per rep) and then
replayed by the baseline on the same loaded model, rep by rep:

- branch_prune: system + a long user turn (code to review), then `turns` times: reason at
  length, answer, prune the reasoning (the answer kept verbatim), ask the next question.
- tree_of_thought: a 2K-token prompt, k reasoning branches (short, sampled), the best by mean
  logprob answers.

The baseline is what a user gets without forkv: mlx-lm's `generate_step` with one prompt cache
(`make_prompt_cache`), reused when the next prompt extends the cached tokens, trimmed back
(`can_trim_prompt_cache`/`trim_prompt_cache`) when the cache allows it, else recomputed from
scratch. It replays the exact token sequences forkv saw (prompts and generated tokens, fed as
its decode steps), so both sides do the same decode work and differ only in prefill. Prefill
tokens are what each side feeds the model for prompts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

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
# of a sliding-window or hybrid model. Generated tokens cost the same on both sides, so longer
# reasoning moves the whole-workflow ratio towards 1, and so does a slow first read (both sides
# pay it once): the targets are per turn after a prune, `turn_speedup` (wall time) and
# `turn_ttft_speedup` (time to the turn's first token). One `small` demo model takes about 4-8 minutes on 2 CPU cores,
# most of it the baseline's recomputes.
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


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(slots=True)
class _Step:
    prompt: list[int]
    generated: list[int]
    parent: int | None = None  # the step whose generation this prompt continues
    parent_text_tokens: int = 0  # tokens of that generation's text as re-encoded here


# -- forkv ---------------------------------------------------------------------------------------
class _Ours:
    """Times `session.run` per step (rendering the trace's prompt happens outside the clock)."""

    def __init__(self, session):
        self.session = session
        self.wall = 0.0
        self.prefill = self.reused = 0
        self.trace: list[_Step] = []
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
            step = _Step(prompt, list(node.result.token_ids))
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

    return Session(Engine(lm))


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


# -- baseline ------------------------------------------------------------------------------------
class _Baseline:
    """mlx-lm generation with one prompt cache, reused as far as mlx-lm can reuse it."""

    def __init__(self, lm):
        self.lm = lm
        self.cache = None
        self.tokens: list[int] = []  # what the cache holds
        self.wall = 0.0
        self.prefill = 0
        self.steps: list[dict] = []

    def run(self, prompt: list[int], generated: list[int]) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

        t0 = time.perf_counter()
        n = _common_prefix(self.tokens, prompt)
        how = "extend"
        if self.cache is None or n < len(self.tokens) or n == len(prompt):
            n = min(n, len(prompt) - 1)  # at least one token to feed
            if self.cache is not None and n > 0 and can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.tokens) - n)
                how = "trim"
            else:
                self.cache, n, how = make_prompt_cache(self.lm.model), 0, "recompute"
        forced = iter(generated)

        def sampler(logprobs):
            # Replays forkv's tokens; tied to the logits so each step is really computed.
            token = next(forced, generated[-1] if generated else 0)
            return mx.argmax(logprobs, axis=-1) * 0 + token

        steps = generate_step(mx.array(prompt[n:]), self.lm.model, prompt_cache=self.cache,
                              max_tokens=len(generated), sampler=sampler)
        ttft = None
        for _ in steps:
            ttft = ttft if ttft is not None else time.perf_counter() - t0
        wall = time.perf_counter() - t0
        self.wall += wall
        self.prefill += len(prompt) - n
        self.tokens = prompt + generated  # generate_step feeds every token it yields
        self.steps.append({"prompt": len(prompt), "reused": n, "computed": len(prompt) - n,
                           "generated": len(generated), "cache": how, "wall_s": round(wall, 3),
                           "ttft_s": round(wall if ttft is None else ttft, 4)})


def _replay(lm, trace: list[_Step]) -> _Baseline:
    base = _Baseline(lm)
    for step in trace:
        prompt = step.prompt
        if step.parent is not None:
            # A prompt that continues a generation holds its text re-encoded; give the baseline
            # the generated tokens themselves, so it can extend its cache as with a real model.
            pp, pg = trace[step.parent].prompt, trace[step.parent].generated
            if prompt[: len(pp)] == pp:
                prompt = pp + pg + prompt[len(pp) + step.parent_text_tokens:]
        base.run(prompt, step.generated)
    return base


# -- the benchmark -------------------------------------------------------------------------------
def _warm_up(lm, model: str) -> None:
    """Run both paths once on a short prompt, so first-call costs hit neither measurement."""
    s = _session(lm, model)
    try:
        node = s.user("warm up " * 40).final(_gen(lm, model, max_tokens=2))
        s.run(node)
        _replay(lm, [_Step(s.prompt(node.parent).token_ids, list(node.result.token_ids))])
    finally:
        s.engine.close()


def run_agent_bench(model: str = "demo:gemma3:small", quick: bool = False,
                    reps: int | None = None, sizes: Sizes | None = None, **size: int) -> dict:
    """Branch-and-prune and tree-of-thought, forkv vs plain mlx-lm, interleaved per rep.
    `size` overrides fields of `sizes` (context=2048, turns=2, ...)."""
    from forkv.engine import load_model

    unknown = set(size) - set(Sizes.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown agent size {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(Sizes.__dataclass_fields__)}.")
    sz = replace(sizes or (QUICK if quick else FULL), **size)
    reps = reps or 1
    lm = load_model(model)
    doc = _text_of(lm.tokenizer, "Review this module:\n\n", sz.context)
    problem = _text_of(lm.tokenizer, "Find the bug behind this failing test log:\n",
                       sz.tot_prompt)
    _warm_up(lm, model)
    runs: dict[str, list[tuple[_Ours, _Baseline]]] = {"branch_prune": [], "tree_of_thought": []}
    for _ in range(reps):
        ours = _branch_prune(lm, model, sz, doc)
        runs["branch_prune"].append((ours, _replay(lm, ours.trace)))
        ours = _tree_of_thought(lm, model, sz, problem)
        runs["tree_of_thought"].append((ours, _replay(lm, ours.trace)))
    cases = [_case(name, pairs) for name, pairs in runs.items()]
    bp, tot = cases
    headline = {"speedup": bp["speedup"], "prefill_ratio": bp["prefill_ratio"],
                "turn_speedup": bp["turn_speedup"], "turn_ttft_speedup": bp["turn_ttft_speedup"],
                "tot_speedup": tot["speedup"], "tot_prefill_ratio": tot["prefill_ratio"]}
    # The whole-workflow `speedup` is bound by decode and the first read of the document,
    # which both sides pay alike: a reported figure, not a target.
    return result(
        "agent", model, {**asdict(sz), "reps": reps, "quick": quick, "block_size": 256},
        cases, headline,
        {"turn_speedup": ">= 5", "turn_ttft_speedup": ">= 20", "tot_speedup": ">= 5"},
        notes=[("baseline: mlx-lm generate_step with one prompt cache (extend, else trim if "
                "trimmable, else recompute), replaying forkv's exact tokens"),
               ("demo models sample ASCII bytes only, so generated text round-trips through the "
                "tokenizer as a real model's does")],
        dtype=lm.dtype)


def _case(name: str, pairs: list[tuple[_Ours, _Baseline]]) -> dict:
    ours_wall = [o.wall for o, _ in pairs]
    base_wall = [b.wall for _, b in pairs]
    ours, base = pairs[0]
    return {
        "workflow": name,
        "forkv": {"wall_s": summary(ours_wall), "prefill_tokens": ours.prefill,
                  "reused_tokens": ours.reused,
                  "generated_tokens": sum(len(t.generated) for t in ours.trace),
                  "steps": ours.steps},
        "mlx_lm": {"wall_s": summary(base_wall), "prefill_tokens": base.prefill,
                   "steps": base.steps},
        "speedup": round(summary(base_wall)["median"] / summary(ours_wall)["median"], 2),
        "prefill_ratio": round(base.prefill / max(1, ours.prefill), 2),
        "turn_speedup": _turn_speedup(pairs) if name == "branch_prune" else None,
        "turn_ttft_speedup": _turn_ttft_speedup(pairs) if name == "branch_prune" else None,
    }


def _turn_speedup(pairs: list[tuple[_Ours, _Baseline]]) -> float | None:
    """Median over the turns after a prune (reasoning + answer, both sides) of baseline wall
    over ours: what each later turn costs once the document has been read, which both sides
    pay once (the whole-workflow `speedup` includes that first read)."""
    ratios = []
    for ours, base in pairs:
        walls = [(o["wall_s"], b["wall_s"]) for o, b in zip(ours.steps, base.steps)]
        turns = [walls[i:i + 2] for i in range(2, len(walls) - 1, 2)]  # skip the first turn
        ratios += [sum(b for _, b in t) / max(1e-9, sum(o for o, _ in t)) for t in turns]
    return round(summary(ratios)["median"], 2) if ratios else None


def _turn_ttft_speedup(pairs: list[tuple[_Ours, _Baseline]]) -> float | None:
    """Median over the turns after a prune of baseline ÷ ours time to the first token of the
    turn (its reasoning step): what a user waits before a later turn starts to stream."""
    ratios = []
    for ours, base in pairs:
        firsts = [(o["ttft_s"], b["ttft_s"]) for o, b in zip(ours.steps, base.steps)]
        ratios += [b / max(1e-9, o) for o, b in firsts[2::2]]  # each later turn's reasoning
    return round(summary(ratios)["median"], 2) if ratios else None
