"""Rendering a root→node path to chat messages, prompt text, token ids and per-node spans.

Knows how node kinds map to chat roles, how a reasoning node is written around the model's
generation prompt (`ReasoningFormat`), how to find each node's token span, and which blocks
overlap each span. Tools declared on the path go to the template as `tools=`; a final node's
tool calls become its message's `tool_calls` (the template writes them in its own syntax).
Knows tokenizers only through a duck-typed protocol
(`apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` and
`encode(text, add_special_tokens=False)`), which Hugging Face tokenizers and mlx-lm's
TokenizerWrapper satisfy. Does not key blocks, cache or run anything.

Span rule: a span holds the tokens a node adds *as they appear in this render*; it starts where
the previous node's ended. Node i's end: render the path up to and including node i; if that
text is a prefix of the whole render, the end is the longest common token prefix of its tokens
and the whole render's tokens (BPE merges across the boundary go to the later node). If a later
turn changed how node i renders (many templates drop old reasoning), find node i's content
followed by its end-of-turn text in the whole render after the previous node, ending no later
than it ends in node i's own render, and end there; if that text is gone (the dropped reasoning
itself), fall back to the longest common token prefix, which leaves such a node only what both
renders share - often just the role header. Reuse is decided on tokens, never on these spans.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .chat_render import render_chat
from .errors import NodeStateError
from .gen_prompt import generation_suffix
from .render_cache import (
    NodeEnd,
    PathState,
    RenderCache,
    common_prefix,
    end_bounds,
    render_cache,
    reusable_ends,
    signature,
    token_array,
)
from .token_extend import extend_encoding_at
from .toolformat import ToolFormat, detect_format
from .tools import visible_tools

if TYPE_CHECKING:
    from .nodes import Node, NodeLike
    from .tree import Tree

__all__ = ["ImageRef", "ReasoningFormat", "RenderedPath", "Tokenizer", "block_range", "render"]


@runtime_checkable
class Tokenizer(Protocol):
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kw: Any,
    ) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


class ReasoningFormat(BaseModel):
    """How reasoning is written after the generation prompt.

    A reasoning node is generated after `open`; a final node after a reasoning node follows
    `open + reasoning + close`; a final node without reasoning follows `empty` (set it to
    e.g. "<think>\\n\\n</think>\\n\\n" for templates that expect an empty think block).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    open: str = "<think>\n"
    close: str = "\n</think>\n\n"
    empty: str = ""

    @property
    def close_tag(self) -> str:
        """The stop string that ends a reasoning node (`close` stripped)."""
        return self.close.strip()


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image on the path: its hash, its node, and its placeholder token position if known."""

    sha256: str
    node_id: str
    position: int | None = None


def block_range(span: tuple[int, int], block_size: int) -> range:
    """Indices of the blocks of `block_size` tokens that overlap `span` (empty for empty spans)."""
    start, end = span
    if end <= start:
        return range(0)
    return range(start // block_size, (end - 1) // block_size + 1)


@dataclass(frozen=True, slots=True, eq=False)
class RenderedPath:
    """One rendered path.

    `is_prompt` is True when `node_id` is to be generated: then `token_ids` is its prompt,
    `spans[node_id]` covers the generation-prompt tokens it adds (role header, think tag) and
    its generated tokens start at `len(token_ids)`. Otherwise the path ends with `node_id`.
    `messages` (the chat the template was given) are written on first read, from the nodes
    as they were rendered: most callers never read them, and a deep path has many.
    """

    node_id: str
    prompt_text: str
    token_ids: list[int]
    spans: dict[str, tuple[int, int]]
    images: list[ImageRef]
    is_prompt: bool
    _chat: tuple = ()  # (the messages' signatures and nodes, tool format): see `messages`
    _messages: list[dict[str, Any]] | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        if self._messages is None:
            object.__setattr__(self, "_messages", _snapshot_messages(*self._chat))
        return self._messages

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RenderedPath):
            return NotImplemented
        return (self.node_id, self.prompt_text, self.token_ids, self.spans, self.images,
                self.is_prompt, self.messages) == (
            other.node_id, other.prompt_text, other.token_ids, other.spans, other.images,
            other.is_prompt, other.messages)

    __hash__ = None  # (mutable fields, as before)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def blocks(self, block_size: int = 256) -> dict[str, range]:
        """For each node on the path, the indices of the blocks overlapping its span."""
        return {node_id: block_range(span, block_size) for node_id, span in self.spans.items()}


def _content(node: Node) -> Any:
    if not node.images:
        return node.text or ""
    return [{"type": "image"} for _ in node.images] + [{"type": "text", "text": node.text or ""}]


def _messages(nodes: Sequence[Node], calls: ToolFormat | None = None) -> list[dict[str, Any]]:
    """Chat messages for done nodes; a reasoning node joins the final after it. A final node's
    tool calls become the message's `tool_calls` and leave its content (`calls` says how
    they are written in generated text), so the template writes them its own way."""
    out: list[dict[str, Any]] = []
    reasoning: str | None = None
    for node in nodes:
        if node.kind == "reasoning":
            reasoning = node.text or ""
            continue
        msg: dict[str, Any] = {
            "role": "assistant" if node.kind == "final" else node.kind,
            "content": _content(node),
        }
        if node.kind == "final" and reasoning is not None:
            msg["reasoning_content"] = reasoning
        if node.tool_calls:
            if calls is not None and isinstance(msg["content"], str):
                msg["content"] = calls.split(msg["content"])[0]
            msg["tool_calls"] = [c.to_message() for c in node.tool_calls]
        if node.kind == "tool" and node.name:
            msg["name"] = node.name
        if node.kind == "tool" and node.tool_call_id:
            msg["tool_call_id"] = node.tool_call_id
        reasoning = None
        out.append(msg)
    return out


_kind, _status, _images = (operator.attrgetter(f) for f in ("kind", "status", "images"))


class _Seen(NamedTuple):
    """A node as its `signature` saw it (the same fields, in order): what its message needs."""

    id: str
    kind: str
    status: str
    text: str | None
    name: str | None
    tool_call_id: str | None
    images: tuple  # (their hashes: the message counts them)
    tool_calls: tuple


def _snapshot_messages(sigs: Sequence[tuple] = (), calls: ToolFormat | None = None
                       ) -> list[dict[str, Any]]:
    """`_messages` of nodes as their signatures `sigs` recorded them."""
    return _messages([_Seen(*sig) for sig in sigs], calls)


class _Ids(Sequence):
    """The ids of some nodes, read as asked (a chat's states are looked up from its end)."""

    def __init__(self, nodes: Sequence[Node]):
        self.nodes = nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i):
        return self.nodes[i].id

    def __reversed__(self):
        return (n.id for n in reversed(self.nodes))


class _Chat:
    """The chat of some done nodes (chat_render.Chat): one message per node but reasoning,
    which joins the final after it."""

    def __init__(self, nodes: Sequence[Node], sigs: Sequence[tuple],
                 calls: ToolFormat | None):
        self.nodes, self.sigs, self.calls = nodes, sigs, calls
        kinds = list(map(_kind, nodes))  # (in C: a deep chat often has no reasoning at all)
        self._at = ([i for i, k in enumerate(kinds) if k != "reasoning"]
                    if "reasoning" in kinds else list(range(len(kinds))))
        self.num_messages = len(self._at)

    @property
    def ids(self) -> _Ids:
        return _Ids(self.nodes)

    def messages(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        at = self._at[start:stop]
        if not at:
            return []
        first = at[0]
        if first and self.nodes[first - 1].kind == "reasoning":
            first -= 1  # its reasoning goes into its message
        return _messages(self.nodes[first:at[-1] + 1], self.calls)


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


def render(
    tree: Tree,
    node: NodeLike,
    tokenizer: Tokenizer,
    reasoning: ReasoningFormat | None = None,
    *,
    template_kwargs: dict[str, Any] | None = None,
) -> RenderedPath:
    """Render the path root→`node`: its prompt if `node` is pending, else the whole path.

    Every node above a pending target must be done. `template_kwargs` go to
    `apply_chat_template` (e.g. `enable_thinking`). Spans are found by re-tokenizing prefixes
    (see the module docstring); a render extends the tree's cached render of the path's
    deepest ancestor (render_cache.py), so it costs one template call plus one per node the
    cached render did not cover; where the chat template allows, each call renders only a
    window of the chat's messages and takes the rest from a cached render (chat_render.py);
    encodes reuse the cached tokens up to the last special token the texts share
    (token_extend.py).
    """
    fmt = reasoning or ReasoningFormat()
    path = tree.path(node)
    target = path[-1]
    is_prompt = target.is_pending
    done = path[:-1] if is_prompt else path
    if any(map("done".__ne__, map(_status, done))):  # (checked in C: a deep path has many)
        n = next(n for n in done if n.status != "done")
        raise NodeStateError(
            f"node {n.id!r} above {target.id!r} has no text yet; run it "
            "first (plan() orders the work for you).",
            n.id,
        )
    tools = [t.to_openai() for t in visible_tools(path)]
    cache = render_cache(tree)
    sigs = cache.signatures(done)
    r = _Renderer(tokenizer, fmt, dict(template_kwargs or {}), tools, cache, done, sigs)
    text = r.prompt_text(done, target) if is_prompt else r.path_text(done)
    settings = r.settings
    base = cache.base_for(tokenizer, settings, done, target, sigs)
    reused = 0
    if base is not None:
        old = cache.tokens_list(base)  # base.tokens as a list, where the cache kept one
        tokens = r.encode_from(text, base.text, base.tokens if old is None else old)
        reused = r.reused
    else:
        tokens = r.encode(text)
    # the cache's own copy (callers may change `tokens`), the part taken from base's copied
    kept = (base.tokens[:reused] + token_array(tokens[reused:]) if reused
            else token_array(tokens))
    ends = reusable_ends(base, text, kept) if base is not None else []
    if ends and len(ends) == len(done) and not is_prompt:  # the same whole path again
        ends[-1] = NodeEnd(len(tokens), "last")
    prev = ends[-1].end if ends else 0
    prev_char = next((e.char_end for e in reversed(ends) if e.char_end is not None), 0)
    for i in range(len(ends), len(done)):
        if i == len(done) - 1 and not is_prompt:
            e = NodeEnd(len(tokens), "last")
        else:
            e = _node_end(r, done, i, text, tokens, prev, prev_char)
            prev_char = e.char_end if e.char_end is not None else prev_char
        ends.append(e)
        prev = e.end
    # The first nodes whose end records are base's own keep base's spans (and its bounds):
    # copied in C, so a deep path's nodes are not walked again.
    j = min(len(ends), len(base.ends)) if base is not None and base.spans is not None else 0
    while j and ends[j - 1] is not base.ends[j - 1]:
        j -= 1
    spans = dict(itertools.islice(base.spans.items(), j)) if j else {}
    start = ends[j - 1].end if j else 0
    for n, e in zip(itertools.islice(done, j, None), itertools.islice(ends, j, None)):
        spans[n.id] = (start, e.end)
        start = e.end
    # base's bounds cover its records but a last one: valid here if all of those are kept
    if j and base.bounds is not None and j >= len(base.ends) - (base.ends[-1].how == "last"):
        bounds = end_bounds(ends, j, base.bounds)
    else:
        bounds = end_bounds(ends)
    state = PathState(tokenizer, settings, sigs, text, kept, ends, spans, bounds)
    cache.put(("prompt" if is_prompt else "done", target.id), state)
    cache.keep_list(state, tokens)
    spans = dict(spans)  # (the caller's own: the state's stays as it is)
    if is_prompt:
        spans[target.id] = (start, len(tokens))
    return RenderedPath(
        node_id=target.id,
        prompt_text=text,
        token_ids=tokens,
        spans=spans,
        images=_image_refs(done, spans, tokens, tokenizer),
        is_prompt=is_prompt,
        _chat=(sigs, r.calls),
    )


def _image_refs(
    nodes: Sequence[Node], spans: dict[str, tuple[int, int]], tokens: Sequence[int], tokenizer: Any
) -> list[ImageRef]:
    """Images in path order; positions only when the tokenizer names its image token id."""
    if not any(map(_images, nodes)):  # (checked in C: most paths have none)
        return []
    image_id = getattr(tokenizer, "image_token_id", None)
    out: list[ImageRef] = []
    for n in nodes:
        if not n.images:
            continue
        start, end = spans[n.id]
        hits = (
            [i for i in range(start, end) if tokens[i] == image_id]
            if isinstance(image_id, int)
            else []
        )
        # one placeholder per image, else positions are ambiguous: leave them unknown
        positions = hits if len(hits) == len(n.images) else [None] * len(n.images)
        out.extend(ImageRef(p.sha256, n.id, pos) for p, pos in zip(n.images, positions))
    return out
