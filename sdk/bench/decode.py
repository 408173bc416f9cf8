"""`forkv bench decode`: single-stream decode speed with speculative decoding, `forkv serve`
against llama.cpp's `llama-server` on the same GGUF, through the `openai` client.

Cases (`make_asks`), each a first request and a second, similar one (the headline reads the
second: both servers warm), greedy at a fixed max_tokens with end-of-sequence suppressed, one
client: chat (a question with nothing to repeat; a small model's greedy text soon loops, so
speculation finds its own output to draft from), chatty (the chat prompts sampled, seeded at
temperature 1.0: text that does not repeat, where speculation must cost nothing), edit (a
~1K-token Python module rewritten with one function renamed), toolloop (a JSON tool call whose
arguments repeat an earlier tool result), tree (8 sampled branches of one prompt at once:
forkv's n=8, llama-server's 8 concurrent seeded requests; aggregate tok/s) and kernels (a short
prompt, speculation off). forkv serve runs once with speculation auto and sends every request
again with `"speculate": "off"`, whose text the speculative one must equal; llama-server runs
once per `--spec-type` (none, ngram-simple, ngram-mod), its texts compared with the `none`
server's. Decode tok/s, alike on both sides: (completion tokens - choices) / (last streamed
token - first streamed token) on the client's clock (each choice's first token is prefill's).
Knows the cases and the figures; the processes are `serve_procs`' and `llamacpp`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .common import result
from .llamacpp import start_llama_server
from .serve import _eos_ids, _llama_setup, _repack_crashed
from .serve_procs import ServerProcess, start_forkv

__all__ = ["CASES", "SPEC_TYPES", "Ask", "edit_source", "headline_of", "make_asks",
           "run_decode_bench"]

CASES = ("chat", "chatty", "edit", "toolloop", "tree", "kernels")
SPEC_TYPES = ("none", "ngram-simple", "ngram-mod")
_LLAMA_SPEC_TYPES = SPEC_TYPES + ("ngram-map-k", "ngram-map-k4v", "ngram-cache")
_SPECULATED = ("chat", "chatty", "edit", "toolloop", "tree")  # kernels: speculation off only
TARGETS = {"edit_vs_llamacpp": ">= 1.5", "edit_vs_off": ">= 3", "toolloop_vs_llamacpp": ">= 1.3",
           "tree_vs_llamacpp": ">= 1.3", "chat_spec_vs_off": ">= 0.97",
           "chatty_spec_vs_off": ">= 0.97",
           "chat_vs_llamacpp": ">= 1.1", "spec_identical": "== true", "llamacpp_ok": "== true"}


@dataclass(frozen=True, slots=True)
class Ask:
    """One request as every side sends it."""

    messages: tuple[dict, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    n: int = 1


# The edit case's module: fixed blocks, so every side and every run sees the same prompt.
_BLOCKS = (
    '"""Order intake: parse exported records, merge them into batches, report on them."""\n\n'
    "from __future__ import annotations\n\nimport json\nimport time\n"
    "from dataclasses import dataclass, field\n\nDEFAULT_FIELDS = (\"id\", \"customer\", "
    "\"sku\", \"qty\", \"status\")\n",
    "def parse_record(line: str, fields: tuple[str, ...] = DEFAULT_FIELDS) -> dict:\n"
    '    """One tab-separated export line as a dict; missing fields are None."""\n'
    "    values = line.rstrip(\"\\n\").split(\"\\t\")\n"
    "    record = {name: (values[i] if i < len(values) else None) for i, name in "
    "enumerate(fields)}\n    if record[\"qty\"] is not None:\n"
    "        record[\"qty\"] = int(record[\"qty\"])\n    return record\n",
    "def normalize_name(name: str) -> str:\n"
    '    """Customer names compare case-blind, without stray spaces."""\n'
    "    return \" \".join(part.capitalize() for part in name.split())\n",
    "def merge_batches(batches: list[list[dict]], limit: int = 500) -> list[list[dict]]:\n"
    '    """Concatenate batches, dropping duplicate ids, and split at `limit` records."""\n'
    "    seen, merged = set(), []\n    for batch in batches:\n        for record in batch:\n"
    "            if record[\"id\"] in seen:\n                continue\n"
    "            seen.add(record[\"id\"])\n            merged.append(record)\n"
    "    return [merged[i:i + limit] for i in range(0, len(merged), limit)]\n",
    "def read_export(path: str) -> list[dict]:\n"
    '    """Every record of an export file, names normalized."""\n'
    "    with open(path, encoding=\"utf-8\") as f:\n"
    "        records = [parse_record(line) for line in f if line.strip()]\n"
    "    for record in records:\n"
    "        record[\"customer\"] = normalize_name(record[\"customer\"] or \"\")\n"
    "    return records\n",
    "def score_items(records: list[dict], weights: dict[str, float]) -> dict[str, float]:\n"
    '    """Weighted quantity per sku; unknown skus weigh 1."""\n'
    "    scores: dict[str, float] = {}\n    for record in records:\n"
    "        weight = weights.get(record[\"sku\"], 1.0)\n"
    "        scores[record[\"sku\"]] = scores.get(record[\"sku\"], 0.0) + weight * "
    "record[\"qty\"]\n    return dict(sorted(scores.items(), key=lambda kv: -kv[1]))\n",
    "@dataclass\nclass Inventory:\n"
    '    """Stock per sku, filled from merged batches."""\n\n'
    "    stock: dict[str, int] = field(default_factory=dict)\n\n"
    "    def add_batches(self, batches: list[list[dict]]) -> None:\n"
    "        for batch in merge_batches(batches):\n            for record in batch:\n"
    "                self.stock[record[\"sku\"]] = self.stock.get(record[\"sku\"], 0) + "
    "record[\"qty\"]\n\n    def take(self, sku: str, qty: int) -> bool:\n"
    "        if self.stock.get(sku, 0) < qty:\n            return False\n"
    "        self.stock[sku] -= qty\n        return True\n",
    "class RateLimiter:\n"
    '    """At most `rate` calls per second, waiting when called faster."""\n\n'
    "    def __init__(self, rate: float):\n        self.interval = 1.0 / rate\n"
    "        self.last = 0.0\n\n    def wait(self) -> None:\n"
    "        delay = self.last + self.interval - time.monotonic()\n        if delay > 0:\n"
    "            time.sleep(delay)\n        self.last = time.monotonic()\n",
    "def format_report(records: list[dict], weights: dict[str, float]) -> str:\n"
    '    """A JSON summary: record count, customers, the top skus by score."""\n'
    "    scores = score_items(records, weights)\n"
    "    customers = sorted({record[\"customer\"] for record in records})\n"
    "    return json.dumps({\"records\": len(records), \"customers\": customers,\n"
    "                       \"top\": list(scores)[:5]}, indent=2)\n",
    "def run(paths: list[str], weights: dict[str, float]) -> str:\n"
    '    """Read every export, merge them, stock the inventory, report."""\n'
    "    limiter = RateLimiter(20.0)\n    batches = []\n    for path in paths:\n"
    "        limiter.wait()\n        batches.append(read_export(path))\n"
    "    inventory = Inventory()\n    inventory.add_batches(batches)\n"
    "    merged = [record for batch in merge_batches(batches) for record in batch]\n"
    "    return format_report(merged, weights)\n",
)
_QUICK_BLOCKS = (0, 1, 3, 4)  # still holds both renamed functions and their callers
_RENAMES = (("parse_record", "read_record"), ("merge_batches", "combine_batches"))


def edit_source(quick: bool = False) -> str:
    """The edit case's Python module (about 1K tokens; --quick: about a third of it)."""
    blocks = [_BLOCKS[i] for i in _QUICK_BLOCKS] if quick else _BLOCKS
    return "\n\n".join(blocks)


def _records(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": 1000 + i, "customer": rng.choice(("Ada Lovelace", "Alan Turing",
                                                      "Grace Hopper", "Edsger Dijkstra")),
             "sku": f"SKU-{rng.randrange(100, 999)}", "qty": rng.randrange(1, 40),
             "status": "open"} for i in range(count)]


def _toolloop(quick: bool, max_tokens: int) -> tuple[Ask, Ask]:
    """An agent loop: tool results in earlier turns, the next call repeats them."""
    records = _records(7, 4 if quick else 12)
    def call(tool: str, args: dict) -> str:
        return json.dumps({"tool": tool, "arguments": args})

    messages = [
        {"role": "system", "content": "You are an order agent. Call a tool by replying with "
         "one JSON object {\"tool\": NAME, \"arguments\": {...}} and nothing else. Tools: "
         "search_orders(customer, status), archive_orders(orders), send_report(orders, to)."},
        {"role": "user", "content": "Archive every open order, then report them to ops."},
        {"role": "assistant", "content": call("search_orders", {"status": "open"})},
        {"role": "user", "content": "Tool result (search_orders):\n"
         + json.dumps(records, indent=1)},
        {"role": "user", "content": "Now call archive_orders with all of these orders, each "
         "record exactly as above."}]
    archived = [dict(r, status="archived") for r in records]
    second = messages + [
        {"role": "assistant", "content": call("archive_orders", {"orders": records})},
        {"role": "user", "content": "Tool result (archive_orders):\n"
         + json.dumps(archived, indent=1)},
        {"role": "user", "content": "Now call send_report to ops@example.com with all of the "
         "archived orders, each record exactly as above."}]
    return Ask(tuple(messages), max_tokens), Ask(tuple(second), max_tokens)


def make_asks(quick: bool = False, max_tokens: int = 0, branches: int = 8,
              seed: int = 1234) -> dict[str, tuple[Ask, Ask]]:
    """Each case's (first, second) request; max_tokens 0: 400, or 64 with --quick."""
    m = max_tokens or (64 if quick else 400)
    def user(text: str) -> tuple[dict, ...]:
        return ({"role": "user", "content": text},)

    src = edit_source(quick)
    edit = tuple(Ask(user(f"Rewrite this module with the function {old} renamed to {new}. "
                          f"Output the whole module.\n\n```python\n{src}\n```"), m)
                 for old, new in _RENAMES)
    tree = tuple(Ask(user(text), m, 0.8, seed, branches) for text in (
        "Propose a name for a seaside bakery and explain the idea behind it.",
        "Suggest a plan for a rainy weekend in a small mountain town."))
    chat = (Ask(user("Write a short story about a lighthouse keeper."), m),
            Ask(user("Explain how the gears of a bicycle work, to a curious twelve-year-old."),
                m))
    return {"chat": chat, "chatty": tuple(Ask(a.messages, m, 1.0, seed) for a in chat),
            "edit": edit, "toolloop": _toolloop(quick, m), "tree": tree,
            "kernels": (Ask(user("Write on: the history of the printing press."), m),
                        Ask(user("Write on: how tides follow the moon."), m))}


@dataclass(slots=True)
class Stream:
    """What one streamed response (or several sent at once) gave, on the client's clock."""

    texts: list[str]  # one per choice
    completion_tokens: int
    ttft_s: float
    prompt_tokens: int | None
    first_s: float | None  # perf_counter of the first and last streamed text
    last_s: float | None
    accepted: int | None = None  # draft tokens accepted / drafted (None: not reported)
    drafted: int | None = None
    server_tps: float | None = None  # llama-server's timings.predicted_per_second (summed)


def stream_chat(client, model: str, ask: Ask, extra: dict | None = None) -> Stream:
    """Stream one chat completion; draft counts from forkv's usage.completion_tokens_details
    or llama-server's timings (draft_n, draft_n_accepted)."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=list(ask.messages), max_tokens=ask.max_tokens,
        temperature=ask.temperature, stream=True, stream_options={"include_usage": True},
        **({"n": ask.n} if ask.n > 1 else {}),
        **({"seed": ask.seed} if ask.seed is not None else {}),
        **({"extra_body": extra} if extra else {}))
    parts: dict[int, list[str]] = {}
    first = last = None
    usages, timings = [], []
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usages.append(chunk.usage)
        if getattr(chunk, "timings", None):
            timings.append(chunk.timings)
        for choice in chunk.choices:
            text = choice.delta.content if choice.delta else None
            if text:
                first, last = first or now, now
                parts.setdefault(choice.index, []).append(text)
    texts = ["".join(parts[i]) for i in sorted(parts)]
    out = Stream(texts, sum(u.completion_tokens or 0 for u in usages),
                 (first or time.perf_counter()) - t0, usages[0].prompt_tokens if usages else None,
                 first, last)
    details = [getattr(u, "completion_tokens_details", None) for u in usages]
    acc = [getattr(d, "accepted_prediction_tokens", None) for d in details]
    rej = [getattr(d, "rejected_prediction_tokens", None) for d in details]
    if acc and all(a is not None for a in acc + rej):
        out.accepted, out.drafted = sum(acc), sum(acc) + sum(rej)
    if timings:  # llama-server: the last chunk's are the whole request's
        t = timings[-1]
        out.server_tps = t.get("predicted_per_second")
        if t.get("draft_n") is not None:
            out.drafted, out.accepted = t.get("draft_n"), t.get("draft_n_accepted")
    return out


def merge_streams(streams: list[Stream]) -> Stream:
    """Requests sent at once as one: their choices, summed tokens, the span of them all."""
    firsts = [s.first_s for s in streams if s.first_s is not None]
    lasts = [s.last_s for s in streams if s.last_s is not None]

    def total(name):
        values = [getattr(s, name) for s in streams]
        return None if any(v is None for v in values) else sum(values)
    return Stream([t for s in streams for t in s.texts],
                  sum(s.completion_tokens for s in streams), min(s.ttft_s for s in streams),
                  streams[0].prompt_tokens, min(firsts, default=None), max(lasts, default=None),
                  total("accepted"), total("drafted"), total("server_tps"))


def measure(s: Stream) -> dict:
    """One response's row: decode tok/s on the client's clock and the draft figures."""
    span = (s.last_s - s.first_s) if s.first_s is not None and s.last_s is not None else 0.0
    decoded = s.completion_tokens - max(1, len(s.texts))
    tps = round(decoded / span, 2) if span > 0 and decoded > 0 else None
    steps = s.completion_tokens - (s.accepted or 0)  # model steps: one token each + accepted
    return {"tokens_per_s": tps, "completion_tokens": s.completion_tokens,
            "choices": len(s.texts), "prompt_tokens": s.prompt_tokens,
            "ttft_s": round(s.ttft_s, 4), "drafted": s.drafted,
            "accepted": s.accepted,
            "mean_accepted_length": round(s.completion_tokens / steps, 3)
            if s.accepted is not None and steps > 0 else None,
            "server_tokens_per_s": round(s.server_tps, 2) if s.server_tps else None,
            "text": "\x00".join(s.texts)}


def _send(client, model: str, ask: Ask, extra: dict, takes_n: bool) -> dict:
    if ask.n == 1 or takes_n:
        return measure(stream_chat(client, model, ask, extra))

    def one(i: int) -> Stream:  # the n branches as concurrent requests, seeds seed + i
        seed = None if ask.seed is None else ask.seed + i
        return stream_chat(client, model, Ask(ask.messages, ask.max_tokens, ask.temperature,
                                              seed), extra)
    with ThreadPoolExecutor(ask.n) as pool:
        return measure(merge_streams(list(pool.map(one, range(ask.n)))))


def _send_plan(client, server: ServerProcess, plan: list[tuple[str, tuple[str, ...], dict]],
               case: str, which: str, ask: Ask, takes_n: bool, no_eos: dict, out: dict) -> None:
    """Append to `out` {mode: {case: {which: [row, ...]}}} one request per mode of `plan`
    (mode, cases, body) that covers `case`, modes in turn (speculation before off: a server
    may draft from its recent outputs)."""
    for mode, cases, body in plan:
        if case in cases:
            row = _send(client, server.model, ask, {**body, "logit_bias": no_eos}, takes_n)
            out.setdefault(mode, {}).setdefault(case, {}).setdefault(which, []).append(row)
            print(f"  {server.name} {mode}: {case} {which} {row['tokens_per_s']} tok/s",
                  file=sys.stderr, flush=True)


def _take_turns(sides: list, asks: dict, reps: int, no_eos: dict, timeout_s: float,
                notes: list[str]) -> dict:
    """{mode: {case: {which: [row, ...]}}} over `reps` rounds of `sides` ((name, start, plan,
    takes_n) each). Every round starts each side's server afresh (a fresh server drafts
    nothing from its own earlier output) and keeps them all up while each request goes to
    every side in turn, the side that goes first rotating by round: this machine's speed moves
    by 10-40% between minutes, and sides run minutes apart would read that drift as their
    ratio. A peer that fails is a note and is dropped; forkv's failure is an error."""
    import openai

    out: dict = {}
    failed: set[str] = set()

    def fail(name: str, plan, e: Exception) -> None:
        if name == "forkv":
            raise e
        failed.add(name)
        for mode, _, _ in plan:
            out.pop(mode, None)
        notes.append(f"No {name} side: {type(e).__name__}: {e}"[:2000])

    for rep in range(reps):
        up: list = []
        try:
            for name, start, plan, takes_n in sides:
                if name in failed:
                    continue
                try:
                    server = start()
                except Exception as e:  # a peer's failure is a note, not an error
                    fail(name, plan, e)
                    continue
                up.append((name, server, plan, takes_n))
                try:
                    server.wait_ready(timeout=timeout_s)
                except Exception as e:
                    fail(name, plan, e)
            turn = [side for side in up if side[0] not in failed]
            first = rep % len(turn) if turn else 0
            turn = turn[first:] + turn[:first]
            clients = {name: openai.OpenAI(base_url=server.base_url, api_key="bench",
                                           max_retries=0, timeout=timeout_s)
                       for name, server, _, _ in turn}
            for case in CASES:
                for which, ask in zip(("first", "second"), asks.get(case, ()), strict=False):
                    for name, server, plan, takes_n in turn:
                        if name in failed:
                            continue
                        try:
                            _send_plan(clients[name], server, plan, case, which, ask, takes_n,
                                       no_eos, out)
                        except Exception as e:
                            fail(name, plan, e)
        finally:
            for _, server, _, _ in up:
                server.stop()
    return out


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables for a process started inside (llama-server reads LLAMA_ARG_*)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _finish(rows: dict, reference: dict | None) -> dict:
    """Rows over reps -> one row per request: median tok/s, the text's hash, and whether it
    equals `reference`'s (the same side's speculation-off run) in every rep."""
    out = {}
    for case, by_which in rows.items():
        out[case] = {}
        for which, reps in by_which.items():
            refs = (reference or {}).get(case, {}).get(which)
            same = None if refs is None else all(
                r["text"] == f["text"] for r, f in zip(reps, refs, strict=True))
            tps = [r["tokens_per_s"] for r in reps if r["tokens_per_s"] is not None]
            row = {k: v for k, v in reps[-1].items() if k != "text"}
            row.update(tokens_per_s=round(statistics.median(tps), 2) if tps else None,
                       identical_to_off=same,
                       text_sha256=hashlib.sha256(reps[-1]["text"].encode()).hexdigest()[:16])
            if len(reps) > 1:
                row["tokens_per_s_reps"] = [r["tokens_per_s"] for r in reps]
            out[case][which] = row
    return out


def _ratio(num, den) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def llama_ran(raw_llama: dict, spec_types, cases) -> bool:
    """Whether every llama-server spec type the cases need ran: all of them where a case
    speculates, `none` alone for a kernels-only run."""
    speculates = any(c in _SPECULATED for c in cases)
    needed = {s for s in spec_types if speculates or s == "none"}
    return bool(needed) and needed <= set(raw_llama)


def headline_of(forkv: dict, llama: dict, llamacpp_ok: bool) -> dict:
    """The headline from finished rows: forkv {"auto"|"off": {case: {"first"|"second": row}}},
    llama {spec type: same}; each figure reads the second request."""
    def tps(runs: dict, mode: str, case: str):
        return runs.get(mode, {}).get(case, {}).get("second", {}).get("tokens_per_s")

    def best(case: str):
        values = [v for mode in llama if (v := tps(llama, mode, case)) is not None]
        return max(values, default=None)

    same = [row["identical_to_off"] for case in forkv.get("auto", {}).values()
            for row in case.values()]
    return {"edit_vs_llamacpp": _ratio(tps(forkv, "auto", "edit"), best("edit")),
            "toolloop_vs_llamacpp": _ratio(tps(forkv, "auto", "toolloop"), best("toolloop")),
            "tree_vs_llamacpp": _ratio(tps(forkv, "auto", "tree"), best("tree")),
            "edit_vs_off": _ratio(tps(forkv, "auto", "edit"), tps(forkv, "off", "edit")),
            "chat_spec_vs_off": _ratio(tps(forkv, "auto", "chat"), tps(forkv, "off", "chat")),
            "chatty_spec_vs_off": _ratio(tps(forkv, "auto", "chatty"),
                                         tps(forkv, "off", "chatty")),
            "chat_vs_llamacpp": _ratio(tps(forkv, "auto", "chat"), tps(llama, "none", "chat")),
            "decode_kernel_ratio": _ratio(tps(forkv, "off", "kernels"),
                                          tps(llama, "none", "kernels")),
            "spec_identical": all(same) if same and None not in same else None,
            "llamacpp_ok": llamacpp_ok}


def draft_notes(forkv: dict) -> list[str]:
    """What forkv's finished rows ({mode: {case: {which: row}}}) say of its draft counts: none
    reported where requests asked for speculation (a kernels-only run asks for none), or drafts
    where they asked for none."""
    notes = []
    auto = [row for case in forkv.get("auto", {}).values() for row in case.values()]
    if auto and all(row.get("drafted") is None for row in auto):
        notes.append("forkv reported no draft counts (usage.completion_tokens_details."
                     "accepted/rejected_prediction_tokens), so its drafted, accepted and "
                     "mean_accepted_length are unknown: a server without speculation or one "
                     "that does not report it.")
    if any((row.get("drafted") or 0) > 0 for case in forkv.get("off", {}).values()
           for row in case.values()):
        notes.append("forkv drafted on requests sent with speculate=off: the field is not "
                     "honoured, so its 'off' figures are not plain decoding.")
    return notes


def targets_for(model: str) -> dict:
    """TARGETS plus the kernel ratio's, which is model-dependent (Gemma 3's is higher)."""
    return dict(TARGETS, decode_kernel_ratio=">= 1.2" if "gemma3" in model else ">= 1.1")


def run_decode_bench(model: str = "smollm2-135m", quick: bool = False, reps: int = 1,
                     cases: tuple[str, ...] = CASES, llamacpp: str = "auto",
                     spec_types: tuple[str, ...] = SPEC_TYPES, max_tokens: int = 0,
                     branches: int = 8, seed: int = 1234, no_eos: bool = True,
                     timeout_s: int = 900) -> dict:
    """Every case on `forkv serve` (speculation auto, each request again with it off), then on
    llama-server once per spec type (`none` is required: the reference). `llamacpp`: "auto"
    runs it where the model is a GGUF and a llama-server is built, "on" builds it if needed,
    "off" never; `max_tokens` 0: 400 (64 --quick); `no_eos` suppresses end-of-sequence so
    every side decodes max_tokens; `timeout_s` bounds each start and each request."""
    if llamacpp not in ("auto", "on", "off"):
        raise ValueError(f"llamacpp must be auto, on or off, got {llamacpp!r}.")
    bad = [c for c in cases if c not in CASES] or ([] if cases else ["(none)"])
    if bad:
        raise ValueError(f"Unknown decode case {', '.join(bad)}; choose from {', '.join(CASES)}.")
    bad = [s for s in spec_types if s not in _LLAMA_SPEC_TYPES]
    if bad or "none" not in spec_types:
        raise ValueError(f"spec_types takes none plus any of {', '.join(_LLAMA_SPEC_TYPES[1:])}"
                         f" (none is the reference); got {', '.join(spec_types)}.")
    if reps < 1 or branches < 1 or branches > 16 or max_tokens < 0 or timeout_s < 1:
        raise ValueError("reps and timeout_s must be >= 1, branches 1 to 16, max_tokens >= 0.")
    from forkv.engine.models import blas

    blas.activate()
    from forkv.engine.models.loader import pick_dtype, resolve_model_path
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    asks = {c: a for c, a in make_asks(quick, max_tokens, branches, seed).items() if c in cases}
    notes: list[str] = []
    if llamacpp == "off":
        notes.append("No llama-server side: llamacpp=off.")
        llama = None
    else:
        llama = _llama_setup(model, llamacpp, False, notes)
    folder = resolve_model_path(model)
    config = json.loads((Path(folder) / "config.json").read_text())
    eos = {str(i): -100.0 for i in sorted(_eos_ids(load_tokenizer(folder), config))} \
        if no_eos else {}
    dtype = pick_dtype("auto", "bfloat16")
    plan = [("auto", _SPECULATED, {"speculate": "auto"}), ("off", CASES, {"speculate": "off"})]
    sides = [("forkv", lambda: start_forkv(model), plan, True)]
    for spec in spec_types if llama is not None else ():
        binary, gguf, template = llama

        def start(spec=spec, binary=binary, gguf=gguf, template=template):
            _repack_crashed(binary, gguf)  # probed before the spec type is in the environment
            with _env(LLAMA_ARG_SPEC_TYPE=spec):  # llama-server's --spec-type
                return start_llama_server(binary, gguf, chat_template=template, tuned=True,
                                          slots=branches)
        sides.append((f"llama-server --spec-type {spec}", start,
                      [(spec, CASES if spec == "none" else _SPECULATED, {})], False))
    raw = _take_turns(sides, asks, reps, eos, timeout_s, notes)
    raw_forkv = {mode: raw[mode] for mode in ("auto", "off") if mode in raw}
    raw_llama = {spec: raw[spec] for spec in spec_types if spec in raw}
    if llama is not None and _repack_crashed(llama[0], llama[1]):
        notes.append("llama-server segfaults at start with weight repacking on this CPU, so "
                     "it ran with --no-repack.")
    forkv = {mode: _finish(rows, raw_forkv.get("off") if mode == "auto" else None)
             for mode, rows in raw_forkv.items()}
    llama_rows = {spec: _finish(rows, raw_llama.get("none") if spec != "none" else None)
                  for spec, rows in raw_llama.items()}
    ok = llama is not None and llama_ran(raw_llama, spec_types, tuple(asks))
    headline = headline_of(forkv, llama_rows, ok)
    notes += draft_notes(forkv)
    rows = [{"case": c, "forkv": {m: forkv[m][c] for m in forkv if c in forkv[m]},
             "llama_server": {s: llama_rows[s][c] for s in llama_rows if c in llama_rows[s]}}
            for c in CASES if c in asks]
    settings = {"reps": reps, "cases": list(asks), "spec_types": list(spec_types),
                "max_tokens": next(iter(asks.values()))[0].max_tokens if asks else None,
                "branches": branches, "seed": seed, "no_eos": no_eos, "quick": quick,
                "edit_source_chars": len(edit_source(quick))}
    return result("decode", model, settings, rows, headline, targets_for(model),
                  notes + _NOTES, dtype=dtype)


_NOTES = [
    "Each server is a separate process on loopback, driven by the openai client with streaming"
    "; one client. Decode tok/s = (completion tokens - choices) / (last streamed token - "
    "first streamed token) on the client's clock, alike on both sides; llama-server's own "
    "timings.predicted_per_second is server_tokens_per_s (summed over the tree's requests).",
    "Every case sends a first request (the first case's on a fresh server) and a second, "
    "similar one; the headline reads the second. Greedy (tree: temperature 0.8, fixed seeds) "
    "at a fixed max_tokens, end-of-sequence suppressed (logit_bias) unless no_eos=false.",
    "Each rep starts forkv serve and each llama-server afresh and keeps them all up; every "
    "request goes to each side in turn (the first side rotating by rep), so that the "
    "machine's drift over minutes favours none. forkv serve: speculation auto (request field "
    "speculate=auto), every request sent again with speculate=off right after; "
    "identical_to_off compares the two texts. llama-server: the same GGUF, tuned (one slot "
    "per tree branch, unified KV), one process per --spec-type and rep; its texts are "
    "compared with the none server's. "
    "*_vs_llamacpp: forkv auto over llama-server's best spec type; chat_vs_llamacpp and "
    "decode_kernel_ratio (forkv off, kernels) against --spec-type none.",
    "mean_accepted_length = completion tokens / (completion tokens - accepted draft tokens): "
    "tokens per model step; drafted = accepted + rejected (forkv) or timings.draft_n "
    "(llama-server).",
]
