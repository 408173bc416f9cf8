"""What `render` keeps between calls so that a path's rendering extends its parent's.

A render of a path finds each node's span by re-rendering and re-encoding the path up to that
node (see render.py): one template call and one encode per node, O(depth^2) over a
conversation. The span of a node a parent's render covered stays valid in a child's render
whenever the node's own path text lies inside the text both renders share (so the child's text
need not extend the parent's: a template that drops old reasoning changes only the last turn)
and its token end inside the tokens they share; only the nodes from the first one that fails
are then worked out, and their own path texts and tokens come from cached renders where the
cache has them (`path_state`). A `PathState` is one render's text, tokens and per-node end
records; a tree's `RenderCache` keeps recent ones, the chat template's renders by chat
(`chats`, chat_render.py) and recent root->node paths.

Entries are checked, not trusted: a state serves only a path whose nodes still render the same
(kind, text, status, images, tool calls, ...: `signature`) under the same tokenizer, reasoning
format and template arguments, so an edit, reset or removal anywhere above makes it a miss. A
node's signature is kept until one of the fields it reads is assigned (Node.__setattr__), so a
deep path's are compared, not rebuilt; a node with images or tool calls is signed at every
render (a list can change in place).
A state also keeps its spans and the bounds of its end records, so a render that extends it
copies them instead of walking every node above.
Knows nothing of templates or tokenizers beyond object identity.
"""

from __future__ import annotations

import itertools
import operator
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .chat_render import ChatStates
from .lru import SizedLRU

if TYPE_CHECKING:
    from .nodes import Node

__all__ = ["NodeEnd", "PathState", "RenderCache", "common_prefix", "end_bounds", "render_cache",
           "reusable_ends", "signature", "token_array"]

# Each state holds a whole path's text and tokens: bounded in number and in tokens, least
# recently used out (the newest always stays).
MAX_STATES = 64
MAX_TOKENS = 1 << 22
MAX_PATHS = 16  # (a path holds one reference per node on it)


@dataclass(frozen=True, slots=True)
class NodeEnd:
    """How one node's end was found in a render.

    `how`: "prefix" (the path up to it renders as a prefix of the whole text), "found" (its
    content and end-of-turn text found after the previous node), "lost" (neither: the longest
    common token prefix of its own render), "none" (its path could not be rendered alone: it
    ends where the previous node did) or "last" (the last node of a whole path: the end of
    the tokens). `char_end` is the character end for prefix/found; `prefix_len` the length of
    its own path's text; `raw` the common token prefix before clamping to the previous end,
    over an encoding of `enc_len` tokens.
    """

    end: int
    how: str
    char_end: int | None = None
    raw: int = 0
    enc_len: int = 0
    prefix_len: int = 0


@dataclass(slots=True)
class PathState:
    """One render: its settings, the done nodes it covered, text, tokens (a copy, int32) and
    node ends; `spans` (the done nodes' spans, by id, in path order) and `bounds` (`end_bounds`
    of `ends`) where the render kept them, so that a render extending this one copies what
    holds instead of walking every node again."""

    tokenizer: Any
    settings: tuple
    sigs: list[tuple]
    text: str
    tokens: array
    ends: list[NodeEnd]
    spans: dict[str, tuple[int, int]] | None = None
    bounds: tuple[int, int] | None = None


def end_bounds(ends: Sequence[NodeEnd], start: int = 0, bounds: tuple[int, int] = (-1, -1)
               ) -> tuple[int, int]:
    """(the longest `prefix_len`, the largest `raw`) over the records `reusable_ends` checks
    (all but "none" and "last") of `ends[start:]`, folded into `bounds` (those of the first
    `start`)."""
    most_chars, most_raw = bounds
    for e in itertools.islice(ends, start, None):
        if e.how != "none" and e.how != "last":
            most_chars = max(most_chars, e.prefix_len)
            most_raw = max(most_raw, e.raw)
    return most_chars, most_raw


_node_id = operator.attrgetter("id")
_images, _calls = operator.attrgetter("images"), operator.attrgetter("tool_calls")


def signature(node: Node) -> tuple:
    """Everything about `node` that its rendering reads (render._Seen names the fields)."""
    d = node.__dict__  # (a model's fields: read ~2x faster than as attributes, per node)
    images, calls = d["images"], d["tool_calls"]
    return (d["id"], d["kind"], d["status"], d["text"], d["name"], d["tool_call_id"],
            tuple(p.sha256 for p in images) if images else (),
            tuple(calls) if calls else ())


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the longest common prefix of two token lists or two arrays (slices compare
    in C), where the caller knows that their first `start` items agree (only the rest is
    compared)."""
    if a is b:
        return len(a)
    n = min(len(a), len(b))
    if start >= n:
        return n
    if not start:  # (the shorter one whole, not a copy of it)
        if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
            return n
    elif a[start:n] == b[start:n]:
        return n
    lo, hi = start, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def token_array(tokens: Sequence[int]) -> array:
    return array("i", tokens)


def reusable_ends(base: PathState, text: str, tokens: array) -> list[NodeEnd]:
    """The end records of `base`'s first nodes as they hold in a render of a path through them
    with `text` and `tokens` (`token_array`): up to the first record that may differ there,
    which `render` works out again with every one after it.

    `text` need not extend base's text (a later turn may change how earlier ones render: many
    templates drop old reasoning); only the text and tokens the two renders share count. A
    node's record holds where its own path's text is no longer than the shared text (so it
    starts both texts or parts from both at the same place, and where its content is found -
    never past that length - is the same in both) and its token end lies inside the shared
    tokens (or its own tokens end there).
    """
    if not base.text:
        return []
    chars = common_prefix(base.text, text)
    shared = common_prefix(base.tokens, tokens)
    ends = base.ends
    start = 0
    if base.bounds is not None and base.bounds[0] <= chars and base.bounds[1] < shared:
        # every record the loop checks holds (the longest text, the largest token end):
        # only a last record is left to look at, not every node of a deep path
        start = len(ends) - 1 if ends and ends[-1].how == "last" else len(ends)
    out: list[NodeEnd] = ends[:start]
    prev = out[-1].end if out else 0
    for e in itertools.islice(ends, start, None):
        if e.how == "last":
            if chars < len(base.text):
                break  # its own path's text (base's whole text) no longer starts `text`
            # It ends where base's tokens and these part (its own tokens are base's).
            e = NodeEnd(max(prev, shared), "prefix", len(base.text), shared, len(base.tokens),
                        len(base.text))
        elif e.how != "none" and e.prefix_len > chars:
            # Its own text may start `text` now, part from it elsewhere, or its content (found
            # only where it ends within its own text's length) may be found elsewhere.
            break
        elif e.how != "none" and not (e.raw < shared or e.raw == e.enc_len <= shared):
            break  # its token end touches where base's tokens and these part
        out.append(e)
        prev = e.end
    return out


def _same_sigs(known: list[tuple], nodes: Sequence[Node], sigs: Sequence[tuple] | None
               ) -> bool:
    """Whether the first nodes (of `nodes`, whose signatures `sigs` may hold) are `known`."""
    if sigs is not None:
        return list(sigs[:len(known)]) == known
    return all(s == signature(n) for s, n in zip(known, nodes))


class RenderCache:
    """Recent `PathState`s of one tree, by (kind, node id): ("done", id) for a whole path
    ending at a node, ("prompt", id) for the prompt of a pending node."""

    def __init__(self) -> None:
        self._states = SizedLRU(lambda: (MAX_STATES, MAX_TOKENS), lambda state: len(state.tokens))
        self._lock = threading.Lock()  # the server renders one tree from several threads
        self.chats = ChatStates()  # template renders by chat (chat_render.py)
        # Recent root->node paths (tuples of nodes), so that a child's extends its parent's
        # instead of walking up the whole path. A node's path never changes (removing a node
        # removes its subtree, and ids never come back).
        self._paths: OrderedDict[str, tuple] = OrderedDict()
        # The newest state's tokens as a list (its own copy): a render extending it slices
        # this instead of converting the state's array back.
        self._list: tuple[PathState, list[int]] | None = None
        # What the tree's last record_render wrote (results.py), so the next writes only
        # what changed; None after anything else changes spans, blocks or turn keys.
        self.record: Any = None
        # Each rendered node's signature, by id, until a field it reads is assigned (Node's
        # __setattr__ calls `forget_signature`; lists count when assigned, not changed in
        # place): a deep path's are looked up in C, not built node by node.
        self._sigs: dict[str, tuple] = {}
        self._listed: set[str] = set()  # ids of the kept signatures with images or tool calls

    def __len__(self) -> int:
        return len(self._states)

    def __reduce__(self):  # a copied or pickled tree starts with an empty cache (and no lock)
        return (RenderCache, ())

    def base_for(self, tokenizer: Any, settings: tuple, done: list[Node],
                 target: Node, sigs: Sequence[tuple] | None = None) -> PathState | None:
        """The deepest cached state whose nodes start `done` and render the same (`sigs`:
        the signatures of `done`, if the caller has them)."""
        # A pending target's own prompt first; a done one's right after its whole path;
        # then the deepest ancestors first (looked up lazily: the first hit is near the end).
        done_keys = (("done", n.id) for n in reversed(done))
        prompt = [("prompt", target.id)]
        keys = (itertools.chain(prompt, done_keys) if target.is_pending
                else itertools.chain(itertools.islice(done_keys, 1), prompt, done_keys))
        for key in keys:
            state = self._states.get(key)
            if state is None:
                continue
            if (state.tokenizer is tokenizer and state.settings == settings
                    and len(state.sigs) <= len(done)
                    and _same_sigs(state.sigs, done, sigs)):
                self._states.touch(key)
                return state
        return None

    def path_state(self, tokenizer: Any, settings: tuple, nodes: Sequence[Node],
                   kind: str = "done", sigs: Sequence[tuple] | None = None
                   ) -> PathState | None:
        """The cached render under these settings of exactly `nodes` ("done": the whole path
        ending at its last node) or of the prompt of the last node above the rest ("prompt");
        `sigs`: the signatures of `nodes` (or more nodes after them), if the caller has them."""
        if not nodes:
            return None
        state = self._states.get((kind, nodes[-1].id))
        done = nodes if kind == "done" else nodes[:-1]
        if (state is None or state.tokenizer is not tokenizer or state.settings != settings
                or len(state.sigs) != len(done) or not _same_sigs(state.sigs, done, sigs)):
            return None
        return state

    def path(self, node: Node, parent_of) -> list[Node]:
        """Nodes from the root to `node`: a cached path above it, extended by walking up from
        `node` with `parent_of` (node -> its parent node)."""
        mine = self._paths.get(node.id)
        if mine is not None:
            return list(mine)
        up = [node]
        top: tuple = ()
        while up[-1].parent_id is not None:
            known = self._paths.get(up[-1].parent_id)
            if known is not None:
                top = known
                break
            up.append(parent_of(up[-1]))
        out = top + tuple(reversed(up))
        with self._lock:
            self._paths[node.id] = out
            self._paths.move_to_end(node.id)
            while len(self._paths) > MAX_PATHS:
                self._paths.popitem(last=False)
        return list(out)

    def signatures(self, nodes: Sequence[Node], has_images: bool | None = None
                   ) -> list[tuple]:
        """`[signature(n) for n in nodes]`, from the signatures kept since the nodes' fields
        were last assigned. `has_images`: whether any of `nodes` has images, where the caller
        has looked already."""
        sigs = self._sigs
        out = list(map(sigs.get, map(_node_id, nodes)))
        if has_images is None:
            has_images = any(map(_images, nodes))
        # A node with images or tool calls, now or when kept, is signed again: its lists can
        # change in place, which no assignment tells (few nodes have any). Where the path has
        # none, that is seen in C, and only the nodes without a kept signature are signed,
        # looked for from the end (a deep path's new turn), not node by node.
        if ((not self._listed or self._listed.isdisjoint(map(_node_id, nodes)))
                and not has_images and not any(map(_calls, nodes))):
            missing, i = out.count(None), len(out)
            while missing:
                i -= 1
                if out[i] is None:
                    out[i] = sigs[nodes[i].id] = signature(nodes[i])
                    missing -= 1
            return out
        for i, node in enumerate(nodes):
            sig, d = out[i], node.__dict__
            if sig is None or sig[6] or sig[7] or d["images"] or d["tool_calls"]:
                out[i] = sigs[node.id] = sig = signature(node)
                if sig[6] or sig[7]:
                    self._listed.add(node.id)
                else:
                    self._listed.discard(node.id)
        return out

    def forget_signature(self, node_id: str) -> None:
        self._sigs.pop(node_id, None)
        self._listed.discard(node_id)

    def keep_list(self, state: PathState, tokens: list[int]) -> None:
        self._list = (state, tokens[:])

    def tokens_list(self, state: PathState) -> list[int] | None:
        """`state`'s tokens as a list, if it is the newest state (do not change it)."""
        kept = self._list
        return kept[1] if kept is not None and kept[0] is state else None

    def put(self, key: tuple[str, str], state: PathState) -> None:
        self._states.put(key, state)

    def clear(self) -> None:
        self._states.clear()
        with self._lock:
            self._paths.clear()
            self._list = None
        self.record = None
        self.chats.clear()
        self._sigs.clear()
        self._listed.clear()

    def drop(self, node_ids) -> None:
        """Forget the states of removed nodes (a miss anyway: their ids never come back)."""
        ids = set(node_ids)
        self._states.drop(lambda key: key[1] in ids)
        with self._lock:
            for key in [k for k in self._paths if k in ids]:
                del self._paths[key]
        self.record = None
        self.chats.drop(ids)
        for node_id in ids:
            self.forget_signature(node_id)


def render_cache(tree: Any) -> RenderCache:
    """The tree's cache, made on first use (trees built or loaded any way get one)."""
    cache = tree.__dict__.get("_render_cache")
    if cache is None:
        cache = tree.__dict__["_render_cache"] = RenderCache()
    return cache
