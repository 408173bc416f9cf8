"""`forkv bench depth`'s server cases: one conversation through the Responses API and Session.

The same linear conversation runs twice, side by side in one run and in lockstep (turn i
through one road, then through the other, so that both see the machine's load alike): through
`Session` in this process, and through a real `forkv serve` on loopback with the official
`openai` client, each turn a `previous_response_id` continuation. Each user turn is
`"Question i: " + "word " * 40`, each answer 4 tokens, greedy; no system prompt. The server runs
with `--reasoning off` so both roads make the same nodes (user, final), and with `--reuse exact`
(Session's engine default) so both restore the same checkpoints and the model computes the same
tokens: what differs is what the server adds (HTTP, JSON, its tree work).
`responses_vs_session` is the median wall time of turns 55-59 (the last five) through Responses
over that through Session.

Contention: while one client runs the whole chain again, a second client sends short streamed
chats one after another; their median time to first token over that of the same chats on the
quiet server is `ttft_under_chain_ratio`. Tree work that ran on the event loop would show here.
The clock stops at the first chunk that carries a token (the chats ask for logprobs): the demo
model's first token of this chat is a byte of a character, which sends no text, so a text clock
would time the second token (a decode step, beside the chain's rows when it runs).
Needs the `openai` package.
"""

from __future__ import annotations

import statistics
import threading
import time

QUESTION = "Question {i}: " + "word " * 40
ANSWER_TOKENS = 4
SHORT_CHAT = [{"role": "user", "content": "Say one short word."}]


def _late(times: list[float], last: int = 5) -> float:
    return statistics.median(times[-last:]) * 1e3


class _SessionChat:
    """The conversation through `Session`, a turn at a time."""

    def __init__(self, model: str):
        from forkv import Session
        from forkv.engine import Engine, load_model

        self.session = Session(Engine(load_model(model)))
        self.node = None

    def turn(self, i: int) -> float:
        """Wall seconds of `session.run(answer)` of turn `i`."""
        text = QUESTION.format(i=i)
        user = self.session.user(text) if self.node is None else self.node.user(text)
        answer = user.final({"max_tokens": ANSWER_TOKENS, "temperature": 0.0})
        t0 = time.perf_counter()
        self.session.run(answer)
        self.node = answer
        return time.perf_counter() - t0


class _ResponsesChat:
    """The conversation through the Responses API, a `previous_response_id` chain."""

    def __init__(self, client, model: str):
        self.client, self.model, self.prev = client, model, None

    def turn(self, i: int) -> float:
        """Wall seconds of `responses.create` of turn `i`, as the client sees it."""
        t0 = time.perf_counter()
        r = self.client.responses.create(model=self.model, input=QUESTION.format(i=i),
                                         max_output_tokens=ANSWER_TOKENS, temperature=0,
                                         previous_response_id=self.prev)
        self.prev = r.id
        return time.perf_counter() - t0


def responses_turns(client, model: str, turns: int) -> list[float]:
    chat = _ResponsesChat(client, model)
    return [chat.turn(i) for i in range(turns)]


def _short_ttfts(client, model: str, count: int, pause: float = 0.02) -> list[float]:
    from .serve_procs import timed_chat

    out = []
    while len(out) < count:
        out.append(timed_chat(client, model, SHORT_CHAT, ANSWER_TOKENS,
                              token_clock=True).ttft_s)
        time.sleep(pause)  # a person at a keyboard, not a flood
    return out


def run_server_cases(model: str, turns: int = 60, quiet_chats: int = 20) -> tuple[dict, dict]:
    """(headline figures, cases) of the Responses-vs-Session and contention runs."""
    import openai

    from .serve_procs import start_forkv

    server = start_forkv(model, reuse="exact")
    sess_chat = _SessionChat(model)
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                               timeout=600)
        responses_turns(client, model, 3)  # first-call costs (a conversation of its own)
        resp_chat = _ResponsesChat(client, model)
        sess, resp = [], []
        for i in range(turns):  # in lockstep: both roads see the machine's load alike
            sess.append(sess_chat.turn(i))
            resp.append(resp_chat.turn(i))
        quiet = _short_ttfts(client, model, quiet_chats)
        chain: list[float] = []
        worker = threading.Thread(target=lambda: chain.extend(
            responses_turns(client, model, turns)), daemon=True)
        worker.start()
        busy = []
        while worker.is_alive():
            busy += _short_ttfts(client, model, 1)
        worker.join()
        quiet_after = _short_ttfts(client, model, quiet_chats)
    finally:
        sess_chat.session.close()
        server.stop()
    quiet_all = quiet + quiet_after  # before and after the chain: the same server, idle
    headline = {
        "session_late_ms": round(_late(sess), 1),
        "responses_late_ms": round(_late(resp), 1),
        "responses_vs_session": round(_late(resp) / _late(sess), 2),
        "responses_turn_10_ms": round(resp[9] * 1e3, 1) if turns >= 10 else None,
        "short_chat_quiet_ttft_ms": round(statistics.median(quiet_all) * 1e3, 1),
        "short_chat_busy_ttft_ms": round(statistics.median(busy) * 1e3, 1) if busy else None,
        "ttft_under_chain_ratio": (round(statistics.median(busy) / statistics.median(quiet_all),
                                         2) if busy else None),
    }
    cases = [{"case": "responses_vs_session", "turns": turns,
              "session_ms": [round(t * 1e3, 1) for t in sess],
              "responses_ms": [round(t * 1e3, 1) for t in resp]},
             {"case": "short_chat_beside_chain", "chain_ms": [round(t * 1e3, 1) for t in chain],
              "quiet_ttft_ms": [round(t * 1e3, 1) for t in quiet_all],
              "busy_ttft_ms": [round(t * 1e3, 1) for t in busy]}]
    return headline, cases
