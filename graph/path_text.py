"""The texts of a path's prefixes, their encodings, and where each node ends in a render.

`_Renderer` renders a path's done nodes (or the prompt of a pending node under them) through
the chat template, taking texts and tokens from the tree's cached renders where it has them
(render_cache.py) and encoding a text from a longer or shorter one it shares a prefix with
(token_extend.py). `_node_end` applies render.py's span rule to one node: where the render of
the path up to it ends in the whole render, in characters and tokens. Knows tokenizers only
through render.py's duck-typed protocol; does not key blocks or assemble spans.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .chat_render import render_chat
from .gen_prompt import generation_suffix
from .messages import _Chat
from .render_cache import NodeEnd, PathState, RenderCache, common_prefix, signature
from .token_extend import extend_encoding_at
from .toolformat import detect_format

if TYPE_CHECKING:
    from .nodes import Node
    from .render import ReasoningFormat, Tokenizer

__all__: list[str] = []  # (the package's own: render.py uses these)


class _Renderer:
    def __init__(self, tokenizer: Tokenizer, fmt: ReasoningFormat, kw: dict[str, Any],
                 tools: list[dict[str, Any]] | None = None, cache: RenderCache | None = None,
                 done: Sequence[Node] = (), sigs: Sequence[tuple] = ()):
        self.tok, self.fmt, self.kw = tokenizer, fmt, kw
        if tools:  # only then: templates without tool support keep working
            self.kw = {**kw, "tools": tools}
        self.calls = detect_format(getattr(tokenizer, "chat_template", None))
        self.cache = cache
        self.settings = (fmt, self.kw)
        self.done, self.sigs = done, sigs  # the path's done nodes and their signatures
        self._prompted: tuple[int, Node, str] | None = None  # the last prompt render
        self._known: dict[str, array] = {}  # tokens of texts taken from cached renders
        self.reused = 0  # see encode_from

    def _sigs(self, nodes: Sequence[Node]) -> list[tuple]:
        """Signatures of `nodes`: the path's, where they are its first nodes."""
        k = len(nodes)
        if k <= len(self.sigs) and (not k or self.done[k - 1] is nodes[-1]):
            return list(self.sigs[:k])
        return [signature(n) for n in nodes]

    def template(self, nodes: Sequence[Node], gen_prompt: bool) -> str:
        last = nodes[-1] if nodes else None
        if (not gen_prompt and self._prompted is not None  # (a path: its length and end)
                and self._prompted[0] == len(nodes) and self._prompted[1] is last):
            # The same chat rendered with the generation prompt: where the template shows
            # the prompt is a fixed suffix (gen_prompt.py), this render is that one less it.
            suffix = generation_suffix(self.tok, self.kw)
            text = self._prompted[2]
            if suffix is not None and text.endswith(suffix):
                return text[: len(text) - len(suffix)]
        chat = _Chat(nodes, self._sigs(nodes), self.calls)
        text = render_chat(self.tok, chat, gen_prompt, self.kw,
                           self.cache.chats if self.cache is not None else None)
        if gen_prompt:
            self._prompted = (len(nodes), last, text)
        return text

    def _cached(self, nodes: Sequence[Node], kind: str) -> PathState | None:
        if self.cache is None:
            return None
        return self.cache.path_state(self.tok, self.settings, nodes, kind, self._sigs(nodes))

    def path_text(self, nodes: Sequence[Node]) -> str:
        """Text of done `nodes`; a trailing reasoning node is written as its final's prompt.
        Taken from the tree's cached render of that path where there is one."""
        state = self._cached(nodes, "done")
        if state is not None:
            self._known[state.text] = state.tokens
            return state.text
        if nodes and nodes[-1].kind == "reasoning":
            # Its own prompt's render, as cached, is the head (the same chat with the prompt).
            state = self._cached(nodes, "prompt")
            if state is not None and state.text.endswith(self.fmt.open):
                head = state.text[: len(state.text) - len(self.fmt.open)]
            else:
                head = self.template(nodes[:-1], True)
            return head + self.fmt.open + (nodes[-1].text or "") + self.fmt.close
        return self.template(nodes, False)

    def prompt_text(self, nodes: Sequence[Node], target: Node) -> str:
        """Text after which `target` (pending, under `nodes[-1]`) is generated."""
        if target.kind == "reasoning":
            return self.template(nodes, True) + self.fmt.open
        if nodes and nodes[-1].kind == "reasoning":
            return self.path_text(nodes)
        return self.template(nodes, True) + self.fmt.empty

    def encode(self, text: str) -> list[int]:
        known = self._known.get(text)
        if known is not None:
            return list(known)
        return list(self.tok.encode(text, add_special_tokens=False))

    def encode_from(self, text: str, old_text: str, old_tokens: Sequence[int]) -> list[int]:
        """encode(`text`), reusing `old_tokens` (old_text's) up to their shared special token
        (`reused`: how many of the first tokens were taken from them)."""
        self.reused = 0
        if text in self._known:
            return self.encode(text)
        got = extend_encoding_at(self.tok, self.encode, text, old_text, old_tokens)
        if got is None:
            return self.encode(text)
        self.reused = got[1]
        return got[0]


def _char_end(prefix: str, content: str, full: str, start: int) -> int | None:
    """Where the node that `prefix` ends with ends in `full`, in characters (None if unknown).

    If `prefix` is a prefix of `full`, at its end. Otherwise a later turn changed how earlier
    turns render: look for the node's content plus the end-of-turn text that follows it in
    `prefix`, from `start` on, ending no later than it ends in `prefix` (later turns may make
    a node render shorter, as dropped reasoning does; the first such match is taken). So a
    node's end never depends on text far below it: a later turn with the same content is no
    match, and a render that extends a cached one keeps the ends of the nodes above.
    """
    if full.startswith(prefix):
        return len(prefix)
    k = prefix.rfind(content) if content else -1
    if k < 0:
        return None
    tail = prefix[k:]
    j = full.find(tail, start, len(prefix))
    return j + len(tail) if j >= 0 else None


def _node_end(r: _Renderer, done: Sequence[Node], i: int, text: str, tokens: list[int],
              prev: int, prev_char: int) -> NodeEnd:
    """Where node `done[i]` ends in the render `text`/`tokens` (not the last of a whole path)."""
    n = done[i]
    try:
        prefix = r.path_text(done[: i + 1])
    except Exception:  # noqa: BLE001 - templates may refuse partial chats; next node absorbs
        prefix = None
    if not prefix:
        return NodeEnd(prev, "none")
    content = n.text or ""
    char_end = _char_end(prefix, content, text, prev_char)
    if char_end is not None:
        enc = r.encode_from(text[:char_end], text, tokens)
        how = "prefix" if text.startswith(prefix) else "found"
        raw = common_prefix(enc, tokens, r.reused)  # (its first r.reused are tokens')
        return NodeEnd(max(prev, raw), how, char_end, raw, len(enc), len(prefix))
    enc = r.encode_from(prefix, text, tokens)
    raw = common_prefix(enc, tokens, r.reused)
    return NodeEnd(max(prev, raw), "lost", None, raw, len(enc), len(prefix))
