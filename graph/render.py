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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .errors import NodeStateError
from .messages import _Seen, _snapshot_messages  # noqa: F401 - _Seen: the fields signed
from .path_text import _node_end, _Renderer
from .render_cache import (
    NodeEnd,
    PathState,
    end_bounds,
    render_cache,
    reusable_ends,
    token_array,
)
from .tools import visible_tools

if TYPE_CHECKING:
    from .nodes import Node, NodeLike
    from .tree import Tree

__all__ = ["ImageRef", "ReasoningFormat", "RenderedPath", "Tokenizer", "block_range", "render"]

_status, _images = operator.attrgetter("status"), operator.attrgetter("images")


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
    has_images = any(map(_images, done))  # (checked in C once: most paths have none)
    sigs = cache.signatures(done, has_images)
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
        images=_image_refs(done, spans, tokens, tokenizer) if has_images else [],
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
