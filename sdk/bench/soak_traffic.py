"""The traffic `forkv bench soak` sends: tenants, the mix of requests, and their tally.

Each client thread loops until its deadline, drawing (seeded) a tenant, a served model and an
action: a multi-turn chat that extends itself, a Responses API chain with two forks from one
response, a read and a DELETE of the chain, a chat or response stream cut after a few chunks,
bad bodies that must be refused (invalid JSON, no model, an unknown model), n > 1, a tool
call round trip, /v1/completions, and GET /v1/models. Every request is one `openai` call (or
one raw POST for the bad bodies) with bounded tokens and a timeout; `Tally` counts each by
outcome: ok, an expected 4xx, or unexpected (5xx, an exception, a 4xx nobody asked for, or
success where a 4xx was due). Knows nothing about processes or sampling.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ACTIONS", "Tally", "Tenant", "make_tenants", "run_client"]

UNKNOWN_MODEL = "soak-no-such-model"
_WORDS = ("river", "stone", "lamp", "orbit", "cedar", "quartz", "meadow", "signal", "harbor",
          "copper", "violet", "lantern", "summit", "ember", "glacier", "falcon", "prism",
          "canyon", "willow", "beacon")
WEATHER = {"name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 10}}}}
TOOLS = [{"type": "function", "function": WEATHER}]
UNEXPECTED = ("unexpected_4xx", "missed_4xx", "5xx", "exception")


@dataclass(slots=True)
class Tenant:
    """One traffic source: an API key (a server tenant), maybe a cache_salt on top."""

    name: str
    key: str
    salt: str | None
    client: object  # openai.OpenAI with this key
    system: str  # the tenant's own system prompt, shared by its conversations

    @property
    def extra_body(self) -> dict:
        return {"cache_salt": self.salt} if self.salt else {}

    @property
    def extra_query(self) -> dict:
        return {"cache_salt": self.salt} if self.salt else {}


def make_tenants(n: int, keys: list[str], base_url: str, http_client, seed: int) -> list[Tenant]:
    """`n` tenants over `keys`: the first len(keys) use a key alone, the rest a key plus their
    own cache_salt (same API tenant, another namespace)."""
    import openai

    clients = {k: openai.OpenAI(base_url=base_url, api_key=k, max_retries=0, timeout=120,
                                http_client=http_client) for k in keys}
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = keys[i % len(keys)]
        out.append(Tenant(f"tenant{i}", key, None if i < len(keys) else f"soak-salt-{i}",
                          clients[key], f"You are assistant {i}. " + _text(rng, 120)))
    return out


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


class Tally:
    """Requests by action and outcome, thread-safe, with the first few unexpected errors."""

    def __init__(self, max_examples: int = 20):
        self._lock = threading.Lock()
        self.counts: Counter = Counter()  # (action, outcome) -> n
        self.examples: list[str] = []
        self._max = max_examples

    def add(self, action: str, outcome: str, detail: str = "") -> None:
        with self._lock:
            self.counts[(action, outcome)] += 1
            if outcome in UNEXPECTED and len(self.examples) < self._max:
                self.examples.append(f"{action}: {outcome}: {detail}"[:500])

    def call(self, action: str, fn: Callable[[], object], expect: int | None = None):
        """Run one request; count it; its result, or None if it failed."""
        import openai

        try:
            out = fn()
        except openai.APIStatusError as e:
            self._status(action, e.status_code, expect, str(e))
            return None
        except Exception as e:  # noqa: BLE001 - a timeout or a dropped connection is counted
            self.add(action, "exception", f"{type(e).__name__}: {e}")
            return None
        if expect is not None:
            self.add(action, "missed_4xx", f"expected {expect}, got a success")
        else:
            self.add(action, "ok")
        return out

    def status(self, action: str, status: int, expect: int | None, detail: str = "") -> None:
        self._status(action, status, expect, detail)

    def _status(self, action: str, status: int, expect: int | None, detail: str) -> None:
        if expect is not None and status == expect:
            self.add(action, "expected_4xx")
        elif expect is not None and status < 400:
            self.add(action, "missed_4xx", f"expected {expect}, got {status}")
        elif status >= 500:
            self.add(action, "5xx", f"{status} {detail}")
        elif expect is None and 200 <= status < 300:
            self.add(action, "ok")
        else:
            self.add(action, "unexpected_4xx", f"{status} {detail}")

    def totals(self) -> dict[str, int]:
        with self._lock:
            out = Counter()
            for (_, outcome), n in self.counts.items():
                out[outcome] += n
        return {"requests": sum(out.values()), "ok": out["ok"],
                "expected_4xx": out["expected_4xx"],
                "unexpected": sum(out[k] for k in UNEXPECTED),
                **{k: out[k] for k in UNEXPECTED}}

    def by_action(self) -> list[dict]:
        with self._lock:
            items = list(self.counts.items())
        rows: dict[str, Counter] = {}
        for (action, outcome), n in items:
            rows.setdefault(action, Counter())[outcome] += n
        return [{"case": a, "requests": sum(c.values()), **dict(sorted(c.items()))}
                for a, c in sorted(rows.items())]


# -- actions: (tenant, model, rng, tally, ctx) ------------------------------------------------
def _chat_extend(t, model, rng, tally, ctx):
    messages = [{"role": "system", "content": t.system}]
    for turn in range(rng.randint(2, 4)):
        messages.append({"role": "user", "content": f"Turn {turn}. " + _text(rng, 40)})
        r = tally.call("chat_extend", lambda: t.client.chat.completions.create(
            model=model, messages=messages, max_tokens=8, temperature=rng.choice((0.0, 0.8)),
            seed=rng.randrange(1 << 16), extra_body=t.extra_body))
        if r is None:
            return
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})


def _responses_fork(t, model, rng, tally, ctx):
    c, q, body = t.client.responses, t.extra_query, t.extra_body

    def create(**kw):
        return tally.call("responses", lambda: c.create(
            model=model, max_output_tokens=8, temperature=0.0, extra_body=body, **kw))

    root = create(input=_text(rng, 60), instructions=t.system)
    if root is None:
        return
    a = create(input="First fork. " + _text(rng, 20), previous_response_id=root.id)
    create(input="Second fork. " + _text(rng, 20), previous_response_id=root.id,
           store=rng.random() < 0.7)
    if a is not None:
        tally.call("responses", lambda: c.retrieve(a.id, extra_query=q))
    tally.call("responses_delete", lambda: c.delete(root.id, extra_query=q))
    if a is not None:  # gone with its parent's subtree
        tally.call("responses_delete", lambda: c.retrieve(a.id, extra_query=q), expect=404)


def _stream_cut(t, model, rng, tally, ctx):
    def cut(stream):
        for i, _ in enumerate(stream):
            if i >= 2:
                break
        stream.close()
        return stream

    if rng.random() < 0.5:
        tally.call("stream_cut", lambda: cut(t.client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": t.system},
                                   {"role": "user", "content": _text(rng, 30)}],
            max_tokens=64, temperature=0.8, stream=True, extra_body=t.extra_body)))
    else:
        tally.call("stream_cut", lambda: cut(t.client.responses.create(
            model=model, input=_text(rng, 30), max_output_tokens=64, stream=True,
            extra_body=t.extra_body)))


def _bad_bodies(t, model, rng, tally, ctx):
    http, url = ctx["http"], ctx["base_url"] + "/chat/completions"
    headers = {"Authorization": f"Bearer {t.key}", "Content-Type": "application/json"}
    ask = [{"role": "user", "content": "hello"}]
    for body, expect in ((b'{"model": "x", "messages": [', 400),
                         (json.dumps({"messages": ask}).encode(), 400),
                         (json.dumps({"model": UNKNOWN_MODEL, "messages": ask}).encode(), 404)):
        try:
            r = http.post(url, content=body, headers=headers, timeout=60)
        except Exception as e:  # noqa: BLE001
            tally.add("bad_body", "exception", f"{type(e).__name__}: {e}")
            continue
        tally.status("bad_body", r.status_code, expect, r.text[:200])


def _n_choices(t, model, rng, tally, ctx):
    tally.call("n_choices", lambda: t.client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": t.system},
                               {"role": "user", "content": _text(rng, 20)}],
        n=rng.randint(2, 4), max_tokens=6, temperature=0.9, extra_body=t.extra_body))


def _tools(t, model, rng, tally, ctx):
    ask = [{"role": "user", "content": f"What is the weather in {rng.choice(_WORDS)}?"}]
    first = tally.call("tools", lambda: t.client.chat.completions.create(
        model=model, messages=ask, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0,
        seed=rng.randrange(1 << 16), extra_body=t.extra_body))
    calls = first.choices[0].message.tool_calls if first is not None else None
    if not calls:
        return
    history = ask + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"}]
    tally.call("tools", lambda: t.client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=4,
        temperature=0.0, extra_body=t.extra_body))


def _completions(t, model, rng, tally, ctx):
    if not ctx["has_completions"]:
        return
    tally.call("completions", lambda: t.client.completions.create(
        model=model, prompt=t.system[:200] + " " + _text(rng, 20), max_tokens=8,
        n=rng.choice((1, 1, 2)), temperature=0.7, extra_body=t.extra_body))


def _models(t, model, rng, tally, ctx):
    tally.call("models", lambda: t.client.models.list())


# name -> (weight, action)
ACTIONS: dict[str, tuple[int, Callable]] = {
    "chat_extend": (5, _chat_extend), "responses": (3, _responses_fork),
    "stream_cut": (2, _stream_cut), "bad_body": (1, _bad_bodies), "n_choices": (2, _n_choices),
    "tools": (2, _tools), "completions": (2, _completions), "models": (1, _models)}


def run_client(index: int, seed: int, deadline: float, stop: threading.Event,
               tenants: list[Tenant], models: list[str], tally: Tally, ctx: dict) -> None:
    """One client thread: draw and run actions until `deadline` or `stop`."""
    rng = random.Random(seed * 1000 + index)
    names = list(ACTIONS)
    weights = [ACTIONS[n][0] for n in names]
    while time.monotonic() < deadline and not stop.is_set():
        name = rng.choices(names, weights)[0]
        ACTIONS[name][1](rng.choice(tenants), rng.choice(models), rng, tally, ctx)
