"""The conversations `forkv bench serve` sends to every server, and what each one measures.

Each case is a function of a `Client` (one server: its openai client, every request's timings
and token counts), the sizes, a text source and a system message; it returns its own fields
plus `ttft_median_s`, the time to first token the headline compares. `Client` adds the sums
every case reports: prompt tokens, tokens computed and cached, generated tokens, tok/s.
Texts are sized in the model's own tokens from a fixed seed, so every side sees the same
prompts. Knows nothing about servers or processes.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .serve_procs import Timed, timed_chat

__all__ = ["CASES", "FULL", "QUICK", "Client", "Sizes", "case_clients", "long_context",
           "run_case"]


@dataclass(frozen=True, slots=True)
class Sizes:
    system_tokens: int  # system prompt of every case
    turn_tokens: int  # user text per turn (extend, reasoning, rewind, prune)
    turns: int  # extend and reasoning turns
    doc_tokens: int  # the fork case's document
    questions: int  # conversations on the document
    rewind_turns: int
    clients: int  # concurrent and tenants cases
    gen_tokens: int  # tokens generated per request where tok/s is measured
    answer_tokens: int  # tokens generated per request elsewhere (TTFT is what is timed)
    alt_conversations: int  # alternate: conversations, each on its own document
    alt_doc_tokens: int
    alt_rounds: int  # turns per conversation, round robin
    deep_turns: int  # deep rewind: trajectory turns, then back to each earlier one
    deep_turn_tokens: int
    prune_steps: int  # think, drop the thinking, answer
    think_tokens: int
    tree_prompt_tokens: int  # tree of thought: one prompt, branches//2 then branches at once
    tree_branches: int
    tenant_system_tokens: int  # tenants: the system prompt the clients share
    prefill_tokens: int  # kernels: one fresh prompt, then one long decode
    decode_tokens: int
    long_tokens: int  # long: one prompt of this many tokens, then a decode, a fork, a rewind
    long_decode_tokens: int


FULL = Sizes(system_tokens=256, turn_tokens=512, turns=6, doc_tokens=6900, questions=8,
             rewind_turns=12, clients=8, gen_tokens=64, answer_tokens=8, alt_conversations=16,
             alt_doc_tokens=2048, alt_rounds=3, deep_turns=8, deep_turn_tokens=2048,
             prune_steps=4, think_tokens=48, tree_prompt_tokens=2048, tree_branches=8,
             tenant_system_tokens=1024, prefill_tokens=4096, decode_tokens=256,
             long_tokens=32000, long_decode_tokens=256)
QUICK = Sizes(system_tokens=64, turn_tokens=96, turns=3, doc_tokens=600, questions=3,
              rewind_turns=4, clients=3, gen_tokens=8, answer_tokens=4, alt_conversations=4,
              alt_doc_tokens=128, alt_rounds=2, deep_turns=3, deep_turn_tokens=96,
              prune_steps=2, think_tokens=8, tree_prompt_tokens=128, tree_branches=4,
              tenant_system_tokens=64, prefill_tokens=256, decode_tokens=16,
              long_tokens=1024, long_decode_tokens=16)
_WORDS = ("river", "stone", "lamp", "orbit", "cedar", "quartz", "meadow", "signal", "harbor",
          "copper", "violet", "lantern", "summit", "ember", "glacier", "falcon", "prism",
          "canyon", "willow", "beacon")


class Texts:
    """Deterministic filler text of an exact token length in the model's tokenizer."""

    def __init__(self, tokenizer, seed: int):
        self.tok, self.rng = tokenizer, random.Random(seed)

    def __call__(self, n: int) -> str:
        words = " ".join(self.rng.choice(_WORDS) for _ in range(n * 2))
        return self.tok.decode(self.tok.encode(words, add_special_tokens=False)[:n])


class Client:
    """One server as the cases see it. `takes_n`: it samples n choices of one prompt (else
    the tree case sends n requests at once); `no_eos`: a logit_bias that keeps the model
    from stopping, for the cases that count tokens per second."""

    def __init__(self, client, model: str, *, takes_n: bool = True,
                 no_eos: dict[str, float] | None = None):
        self.client, self.model, self.takes_n = client, model, takes_n
        self.no_eos = no_eos or {}
        self.requests: list[Timed] = []

    def chat(self, messages: list[dict], max_tokens: int, **kw) -> Timed:
        r = timed_chat(self.client, self.model, messages, max_tokens, **kw)
        self.requests.append(r)  # list.append is atomic: threads may share a Client
        return r

    def at_once(self, requests: list[tuple[list[dict], dict]], max_tokens: int) -> list[Timed]:
        """(messages, chat keywords) pairs sent at once, one thread each."""
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(lambda r: self.chat(r[0], max_tokens, **r[1]), requests))


def _med(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def _rate(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 3) if seconds > 0 else 0.0


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _said(text: str) -> dict:
    return {"role": "assistant", "content": text or "ok"}


def _extend(c, sz, texts, system, drop_answers: bool) -> dict:
    messages, ttft, cached = [system], [], []
    for turn in range(sz.turns):
        messages.append(_user(f"Turn {turn}. " + texts(sz.turn_tokens)))
        r = c.chat(messages, sz.answer_tokens)
        ttft.append(r.ttft_s)
        cached.append(r.cached_tokens)
        messages.append(_said(f"Answer {turn}." if drop_answers else r.text))
    return {"ttft_s": ttft, "later_ttft_s": _med(ttft[1:]), "cached_tokens": cached,
            "ttft_median_s": _med(ttft[1:])}


def _reasoning(c, sz, texts, system) -> dict:
    """The client sends back a short answer, as a thinking model's template drops the
    reasoning it generated."""
    return _extend(c, sz, texts, system, True)


def _fork(c, sz, texts, system) -> dict:
    doc = texts(sz.doc_tokens)
    ttft, cached = [], []
    for q in range(sz.questions):
        question = f"\n\nQuestion {q}: what does part {q} say about {_WORDS[q % len(_WORDS)]}?"
        r = c.chat([system, _user(doc + question)], sz.answer_tokens)
        ttft.append(r.ttft_s)
        cached.append(r.cached_tokens)
    return {"ttft_s": ttft, "first_ttft_s": ttft[0], "later_ttft_s": _med(ttft[1:]),
            "cached_tokens": cached, "ttft_median_s": _med(ttft[1:])}


def _rewind(c, sz, texts, system) -> dict:
    messages, history = [system], []
    for turn in range(sz.rewind_turns):
        messages.append(_user(f"Turn {turn}. " + texts(sz.turn_tokens)))
        r = c.chat(messages, sz.answer_tokens)
        messages.append(_said(r.text))
        history.append(list(messages))
    branch = history[1] + [_user("Back to this point: " + texts(sz.turn_tokens // 4))]
    r = c.chat(branch, sz.answer_tokens)
    return {"rewind_ttft_s": r.ttft_s, "cached_tokens": r.cached_tokens,
            "conversation_tokens": sz.system_tokens + sz.rewind_turns * sz.turn_tokens,
            "ttft_median_s": r.ttft_s}


def _concurrent(c, sz, texts, system) -> dict:
    asks = [([system, _user(f"Client {i}: " + texts(32))], {"extra": c.no_eos})
            for i in range(sz.clients)]
    t0 = time.perf_counter()
    out = c.at_once(asks, sz.gen_tokens)
    wall = time.perf_counter() - t0
    tokens = sum(r.completion_tokens for r in out)
    ttft = [r.ttft_s for r in out]
    return {"wall_s": round(wall, 3), "generated_tokens": tokens,
            "tokens_per_s": _rate(tokens, wall), "ttft_s": ttft, "ttft_median_s": _med(ttft)}


def _alternate(c, sz, texts, system) -> dict:
    """More conversations than a server has slots, one turn each in turn."""
    convs = [[system, _user(f"Document {i}.\n" + texts(sz.alt_doc_tokens) + "\n\nWhat is it "
                                                                           "about?")]
             for i in range(sz.alt_conversations)]
    ttft: list[list[float]] = []
    for rnd in range(sz.alt_rounds):
        ttft.append([])
        for i, conv in enumerate(convs):
            if rnd:
                conv.append(_user(f"Question {rnd} on document {i}: " + texts(24)))
            r = c.chat(conv, sz.answer_tokens)
            ttft[-1].append(r.ttft_s)
            conv.append(_said(r.text))
    later = [t for row in ttft[1:] for t in row]
    return {"ttft_s": ttft, "first_round_ttft_s": _med(ttft[0]), "ttft_median_s": _med(later)}


def _deep_rewind(c, sz, texts, system) -> dict:
    """An agent trajectory in long turns, then back to the end of each earlier turn k."""
    messages, turn_ttft = [system], []
    for turn in range(sz.deep_turns):
        messages.append(_user(f"Log {turn}.\n" + texts(sz.deep_turn_tokens)))
        r = c.chat(messages, sz.answer_tokens)
        turn_ttft.append(r.ttft_s)
        messages.append(_said(r.text))
    rewinds = []
    for k in range(1, sz.deep_turns):
        r = c.chat(messages[:1 + 2 * k] + [_user(f"Back to log {k - 1}: what stood out?")],
                   sz.answer_tokens)
        rewinds.append({"k": k, "ttft_s": round(r.ttft_s, 4), "prompt_tokens": r.prompt_tokens,
                        "cached_tokens": r.cached_tokens, "computed_tokens": r.computed_tokens})
    return {"trajectory_tokens": c.requests[sz.deep_turns - 1].prompt_tokens,
            "turn_ttft_s": turn_ttft, "rewinds": rewinds,
            "ttft_median_s": _med([r["ttft_s"] for r in rewinds])}


def _prune(c, sz, texts, system) -> dict:
    """Each step thinks, answers after its thinking, then drops the thinking: the next
    step's prompt branches off where the thinking began."""
    messages = [system, _user("The task: " + texts(sz.turn_tokens * 2)), _said("Ready.")]
    think_ttft, answer_ttft = [], []
    for step in range(sz.prune_steps):
        ask = _user(f"Step {step}. " + texts(sz.turn_tokens // 4))
        think = c.chat(messages + [ask], sz.think_tokens)
        answer = c.chat(messages + [ask, _said(f"<think>{think.text}</think>"),
                                    _user("Now answer in a line.")], sz.answer_tokens)
        think_ttft.append(think.ttft_s)
        answer_ttft.append(answer.ttft_s)
        messages += [ask, _said(answer.text)]  # the thinking is pruned
    return {"think_ttft_s": think_ttft, "answer_ttft_s": answer_ttft,
            "answer_median_ttft_s": _med(answer_ttft), "ttft_median_s": _med(think_ttft[1:])}


def _tree(c, sz, texts, system) -> dict:
    """k sampled branches of one long prompt at once (n=k, or k requests where the server
    takes no n), for k = branches/2 and branches, each on a fresh prompt."""
    runs = []
    for k in (max(1, sz.tree_branches // 2), sz.tree_branches):
        prompt = [system, _user(f"Propose a plan ({k} ways).\n" + texts(sz.tree_prompt_tokens))]
        kw = {"temperature": 0.8, "extra": c.no_eos}
        t0 = time.perf_counter()
        if c.takes_n:
            out = [c.chat(prompt, sz.gen_tokens, n=k, **kw)]
        else:
            out = c.at_once([(prompt, kw)] * k, sz.gen_tokens)
        wall = time.perf_counter() - t0
        tokens = sum(r.completion_tokens for r in out)
        runs.append({"branches": k, "wall_s": wall, "generated_tokens": tokens,
                     "tokens_per_s": _rate(tokens, wall),
                     "ttft_s": round(min(r.ttft_s for r in out), 4),
                     "computed_tokens": sum(r.computed_tokens or 0 for r in out)})
    rate = _rate(sum(r["generated_tokens"] for r in runs), sum(r["wall_s"] for r in runs))
    return {"runs": runs, "tokens_per_s": rate, "ttft_median_s": _med([r["ttft_s"] for r in runs])}


def _tenants(c, sz, texts, system) -> dict:
    """Clients sharing a system prompt at once, under one cache_salt, then each under its
    own (each part on a fresh system prompt)."""
    out = {}
    for label, salts in (("one_salt", 1), ("salted", sz.clients)):
        shared = {"role": "system", "content": f"Tenants {label}. "
                  + texts(sz.tenant_system_tokens)}
        asks = [([shared, _user(f"Client {i}: " + texts(32))],
                 {"extra": {**c.no_eos, "cache_salt": f"tenant-{i % salts}"}})
                for i in range(sz.clients)]
        t0 = time.perf_counter()
        rs = c.at_once(asks, sz.gen_tokens)
        wall = time.perf_counter() - t0
        out[f"tokens_per_s_{label}"] = _rate(sum(r.completion_tokens for r in rs), wall)
        out[f"ttft_median_s_{label}"] = _med([r.ttft_s for r in rs])
        out[f"computed_tokens_{label}"] = sum(r.computed_tokens or 0 for r in rs)
    # Peers without salts share everything: only the one-salt part's computing compares.
    return dict(out, tokens_per_s=out["tokens_per_s_salted"],
                compared_computed_tokens=out["computed_tokens_one_salt"],
                ttft_median_s=out["ttft_median_s_salted"])


def _kernels(c, sz, texts, system) -> dict:
    """Prefill and decode speed with nothing to reuse: one fresh short prompt (512 tokens,
    where per-call costs weigh more), one fresh long prompt, one long decode. llama-server's
    own timings where it sends them; the client's clock otherwise."""
    skim = c.chat([_user("Skim this. " + texts(min(512, sz.prefill_tokens)))], 1)
    read = c.chat([_user("Read this. " + texts(sz.prefill_tokens))], 1)
    write = c.chat([_user("Write on. " + texts(16))], sz.decode_tokens, extra=c.no_eos)
    client_prefill = _rate(read.computed_tokens or 0, read.ttft_s)
    short = skim.server_prompt_tps or _rate(skim.computed_tokens or 0, skim.ttft_s)
    return {"prefill_tokens_per_s": round(read.server_prompt_tps or client_prefill, 2),
            "prefill_short_tokens_per_s": round(short, 2),
            "prefill_short_tokens": skim.computed_tokens,
            "decode_tokens_per_s": round(write.server_decode_tps or write.decode_tps or 0, 2),
            "client_prefill_tokens_per_s": round(client_prefill, 2),
            "client_decode_tokens_per_s": round(write.decode_tps or 0, 2),
            "decode_tokens": write.completion_tokens, "ttft_median_s": round(read.ttft_s, 4)}


def _long(c, sz, texts, system) -> dict:
    """One long prompt (`long_tokens` of text and a question, no system message) decoding
    `long_decode_tokens` with end-of-sequence suppressed (prefill and decode at that context:
    llama-server's own timings where it sends them, the client's clock otherwise); then a
    fork (the same text, another question: all of it is a shared prefix) and a rewind (back to
    the first branch after the fork: its question, its answer and a new question)."""
    doc = texts(sz.long_tokens)
    first = [_user(doc + "\n\nQuestion A: which word comes first?")]
    read = c.chat(first, sz.long_decode_tokens, extra=c.no_eos)
    fork = c.chat([_user(doc + "\n\nQuestion B: which word comes last?")], sz.answer_tokens)
    rewind = c.chat(first + [_said(read.text), _user("Back to question A: say it again.")],
                    sz.answer_tokens)
    client_prefill = _rate(read.computed_tokens or 0, read.ttft_s)
    return {"long_prompt_tokens": read.prompt_tokens, "prefill_ttft_s": round(read.ttft_s, 4),
            "prefill_tokens_per_s": round(read.server_prompt_tps or client_prefill, 2),
            "decode_tokens_per_s": round(read.server_decode_tps or read.decode_tps or 0, 2),
            "client_prefill_tokens_per_s": round(client_prefill, 2),
            "client_decode_tokens_per_s": round(read.decode_tps or 0, 2),
            "decode_tokens": read.completion_tokens, **_branch("fork", fork),
            **_branch("rewind", rewind), "ttft_median_s": _med([fork.ttft_s, rewind.ttft_s])}


def _branch(name: str, r: Timed) -> dict:
    return {f"{name}_ttft_s": round(r.ttft_s, 4), f"{name}_prompt_tokens": r.prompt_tokens,
            f"{name}_computed_tokens": r.computed_tokens, f"{name}_cached_tokens": r.cached_tokens}


def _extend_kept(c, sz, texts, system) -> dict:
    return _extend(c, sz, texts, system, False)


# In this order on every side; a case's texts are seeded by its place here.
CASES = {"extend": _extend_kept, "reasoning": _reasoning,
         "fork": _fork, "rewind": _rewind, "concurrent": _concurrent, "alternate": _alternate,
         "deep_rewind": _deep_rewind, "prune": _prune, "tree": _tree, "tenants": _tenants,
         "kernels": _kernels, "long": _long}


def case_clients(case: str, sz: Sizes) -> int:
    """Requests a case has in flight at once (or conversations it keeps): a tuned peer's slots."""
    return {"concurrent": sz.clients, "tenants": sz.clients, "tree": sz.tree_branches,
            "alternate": sz.alt_conversations}.get(case, 1)


def long_context(sz: Sizes) -> int:
    """Context tokens a server needs for the long case (its prompt, decode, fork and rewind,
    templates included), in whole 256-token blocks: 32,768 at full size."""
    return -(-(sz.long_tokens + sz.long_decode_tokens + 512) // 256) * 256


def run_case(c: Client, name: str, sz: Sizes, tokenizer, seed: int) -> dict:
    """One case on one server, with the sums every case reports."""
    texts = Texts(tokenizer, seed * 100 + list(CASES).index(name))  # no reuse across cases
    system = {"role": "system", "content": f"Case {name}. " + texts(sz.system_tokens)}
    c.requests = []
    t0 = time.perf_counter()
    out = CASES[name](c, sz, texts, system)
    wall = time.perf_counter() - t0
    rs = c.requests
    generated = sum(r.completion_tokens for r in rs)
    sums = {"requests": len(rs), "prompt_tokens": sum(r.prompt_tokens or 0 for r in rs),
            "computed_tokens": sum(r.computed_tokens or 0 for r in rs),
            "cached_tokens_total": sum(r.cached_tokens or 0 for r in rs),
            "generated_tokens": generated, "tokens_per_s": _rate(generated, wall)}
    return {**sums, **out, "case_wall_s": round(wall, 2)}  # the case's own fields win
