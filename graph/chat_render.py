"""Rendering a chat through its template at the cost of its new messages.

A chat's render extends the cached render of a chat that it extends (the same first messages,
tokenizer and template arguments): the rewritten template (template_window.py) renders only a
window of the new chat - its first messages and those from a little before where the cached
chat ended - and the turns between come from the cached render's text. Which turns may be kept
is what the template's syntax tree says (neighbours read, `loop.last`, values that change as
the chat grows, compared between the two renders), never a guess; where it says none, or the
window's text does not split as it must, the chat renders whole.

Checked, not trusted, as well: each tokenizer's first renders of each kind are compared with
the plain `apply_chat_template` of the whole chat, and a mismatch turns the rewritten template
off for that tokenizer. Tokenizers whose chat template is not a Jinja string, or whose
`apply_chat_template` does not take a `chat_template` argument, render whole as before.
Knows templates only through template_window.py; nothing of nodes or tokens.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .lru import SizedLRU
from .template_window import MARK, WindowTemplate, window_template

__all__ = ["Chat", "ChatState", "ChatStates", "render_chat"]

CHECKED_USES = 3  # whole and window renders per tokenizer compared with a plain render
MAX_STATES = 64
MAX_CHARS = 1 << 24


class Chat(Protocol):
    """A chat to render, as the nodes it comes from: `ids` and `sigs` (everything each node's
    message is made of) root first, and its messages by index (a slice of them)."""

    ids: Sequence[str]
    sigs: Sequence[tuple]
    num_messages: int

    def messages(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]: ...


@dataclass(slots=True)
class ChatState:
    """One chat's render: the signatures of its nodes (a chat whose nodes start with the same
    ones starts with the same messages), its number of messages, the turns' text (`body`;
    turn i is body[starts[i]:starts[i + 1]]) and the values a later render compares
    (`report`)."""

    tokenizer: Any
    kw: dict[str, Any]
    sigs: list[tuple]
    num_messages: int
    body: str
    starts: list[int]
    report: list


class ChatStates:
    """Recent `ChatState`s of one tree, by the id of the last node of their chat."""

    def __init__(self) -> None:
        self._states = SizedLRU(lambda: (MAX_STATES, MAX_CHARS), lambda state: len(state.body))

    def __len__(self) -> int:
        return len(self._states)

    def find(self, tokenizer: Any, kw: dict[str, Any], ids: Iterable[str]) -> ChatState | None:
        """The state of the first node of `ids` (a path, deepest first) that has one under
        these settings (whether its chat starts the caller's is for the caller to check)."""
        for node_id in ids:
            state = self._states.get(node_id)
            if state is not None and state.tokenizer is tokenizer and state.kw == kw:
                self._states.touch(node_id)
                return state
        return None

    def put(self, node_id: str, state: ChatState) -> None:
        self._states.put(node_id, state)

    def drop(self, node_ids) -> None:
        ids = set(node_ids)
        self._states.drop(ids.__contains__)

    def clear(self) -> None:
        self._states.clear()


@dataclass(slots=True)
class _Trust:
    whole_checks: int = CHECKED_USES
    window_checks: int = CHECKED_USES
    ok: bool = True


_trust: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _trust_of(tokenizer: Any) -> _Trust | None:
    try:
        with _lock:
            return _trust.setdefault(tokenizer, _Trust())
    except TypeError:  # not weak-referenceable: render whole
        return None


def _plain(tokenizer: Any, messages: list, gen: bool, kw: dict) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                         **kw)


def _pieces(out: Any, num: int, wt: WindowTemplate):
    """(prelude, turns, tail, report) of a rewritten render of `num` messages, or None."""
    if not isinstance(out, str):
        return None
    parts = out.split(MARK)  # prelude, the turns, the report, the tail
    if len(parts) != num + 3:
        return None
    report: Any = []
    if wt.report:
        try:
            report = json.loads(parts[-2])
        except ValueError:
            return None
        if not isinstance(report, list) or len(report) != wt.report:
            return None
    elif parts[-2]:
        return None
    return parts[0], parts[1:-2], parts[-1], report


def _starts(texts: Sequence[str], at: int = 0) -> list[int]:
    out = []
    for t in texts:
        out.append(at)
        at += len(t)
    return out


def _whole(tokenizer, wt: WindowTemplate, chat: Chat, gen: bool, kw: dict):
    n = chat.num_messages
    out = tokenizer.apply_chat_template(
        chat.messages(), tokenize=False, add_generation_prompt=gen, chat_template=wt.source, **kw,
        forkv_window=False, forkv_hw=n, forkv_d=0, forkv_h=0, forkv_s=0, forkv_a=-1,
        forkv_num=n, forkv_g=[])
    parts = _pieces(out, n, wt)
    if parts is None:
        return None
    pre, turns, tail, report = parts
    body = "".join(turns)
    starts = _starts(turns) + [len(body)]
    return pre + body + tail, ChatState(tokenizer, kw, list(chat.sigs), n, body, starts,
                                        report)


def _first_kept(base: ChatState, wt: WindowTemplate) -> int:
    """The first turn of `base` that a longer chat may render differently, by the syntax."""
    n = base.num_messages
    s = min(n - 1 if wt.uses_last else n, n - wt.ahead)
    for k, c in wt.atoms:
        g = base.report[k]
        if type(g) is int:
            s = min(s, g - c)  # a value that grows moves from here on (checked after)
    return s


def _reached(base: ChatState, report: list, wt: WindowTemplate, h: int, s: int) -> int | None:
    """None if no changed value reaches a kept turn (those in [h, s)); else the first turn it
    may reach, or -1 where that is not known."""
    first = None
    for k, c in wt.atoms:
        g1, g2 = base.report[k], report[k]
        if type(g1) is type(g2) and g1 == g2:
            continue
        if type(g1) is not int or type(g2) is not int:
            return -1
        # `position + c <op> g` differs between g1 and g2 only where position + c lies
        # between them (both included), for every comparison operator.
        lo, hi = min(g1, g2) - c, max(g1, g2) - c
        if s <= lo or hi < h:
            continue
        first = lo if first is None else min(first, lo)
    return first


def _extend(tokenizer, wt: WindowTemplate, base: ChatState, chat: Chat, gen: bool,
            kw: dict):
    n1, n = base.num_messages, chat.num_messages
    k = len(base.sigs)
    if not 0 < n1 <= n or k > len(chat.sigs) or chat.sigs[:k] != base.sigs:
        return None
    h = wt.behind  # the first turns may read the chat's end: always rendered again
    s = _first_kept(base, wt)
    for _ in range(2):
        if s <= h:
            return None
        hw = max(1, h + wt.ahead, wt.head)
        a = min(s - wt.behind, n - wt.tail)
        if a <= hw:
            hw = a = n
        window = chat.messages(0, hw) + chat.messages(a)
        out = tokenizer.apply_chat_template(
            window, tokenize=False, add_generation_prompt=gen, chat_template=wt.source, **kw,
            forkv_window=True, forkv_hw=hw, forkv_d=a - hw, forkv_h=h, forkv_s=s,
            forkv_a=a if a < n else -1, forkv_num=n, forkv_g=base.report[:wt.num_scanned])
        parts = _pieces(out, len(window), wt)
        if parts is None:
            return None
        pre, turns, tail, report = parts
        reach = _reached(base, report, wt, h, s)
        if reach is None:
            break
        if reach < 0:
            return None
        s = reach
    else:
        return None
    full = [j if j < hw else j + a - hw for j in range(len(turns))]  # positions in the chat
    head = [t for f, t in zip(full, turns) if f < h]
    new = [t for f, t in zip(full, turns) if f >= s]
    if len(head) != h or len(new) != n - s or sum(map(len, turns)) != sum(map(len, head + new)):
        return None  # a turn not asked for wrote text
    kept = base.body[base.starts[h]:base.starts[s]]
    first = "".join(head)
    body = first + kept + "".join(new)
    shift = len(first) - base.starts[h]
    starts = (_starts(head) + (base.starts[h:s] if not shift  # (the usual case: a C copy)
                               else [x + shift for x in base.starts[h:s]])
              + _starts(new, len(first) + len(kept)) + [len(body)])
    return pre + body + tail, ChatState(tokenizer, kw, list(chat.sigs), n, body, starts,
                                        report)


def render_chat(tokenizer: Any, chat: Chat, gen: bool, kw: dict[str, Any],
                states: ChatStates | None = None) -> str:
    """`tokenizer.apply_chat_template(chat.messages(), tokenize=False,
    add_generation_prompt=gen, **kw)`, extending the render in `states` of the deepest node
    of the chat that has one where the template allows; this render is kept there under the
    chat's last node."""
    source = getattr(tokenizer, "chat_template", None)
    wt = window_template(source) if isinstance(source, str) and chat.num_messages else None
    trust = _trust_of(tokenizer) if wt is not None else None
    if wt is None or trust is None or not trust.ok:
        return _plain(tokenizer, chat.messages(), gen, kw)
    base = (states.find(tokenizer, kw, reversed(chat.ids))
            if states is not None and chat.ids else None)
    done, windowed = None, False
    try:
        if base is not None:
            done = _extend(tokenizer, wt, base, chat, gen, kw)
            windowed = done is not None
        if done is None:
            done = _whole(tokenizer, wt, chat, gen, kw)
    except Exception:  # noqa: BLE001 - the plain render decides (and raises its own error)
        done = None
    if done is None:
        return _plain(tokenizer, chat.messages(), gen, kw)
    text, state = done
    with _lock:
        checks = trust.window_checks if windowed else trust.whole_checks
        if checks > 0:
            if windowed:
                trust.window_checks -= 1
            else:
                trust.whole_checks -= 1
    if checks > 0:
        plain = _plain(tokenizer, chat.messages(), gen, kw)
        if plain != text:  # not what this tokenizer renders: stop rewriting its template
            trust.ok = False
            return plain
    if states is not None and chat.ids:
        states.put(chat.ids[-1], state)
    return text
