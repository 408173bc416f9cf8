"""Node models: what one turn of a conversation is, as data.

Knows the node kinds, content parts (text, images hashed by sha256), generation settings,
results and per-node statistics, and the token span / block keys a render recorded. Does not
know the tree: the builder methods on `Node` (`user`, `reasoning`, `final`, `tool`, `fork`)
delegate to the tree that owns the node. No tokenizer, no model, no mlx.
"""

from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from .checks import validation_message
from .errors import GraphError
from .tools import Constraint, ToolCall, ToolSpec

if TYPE_CHECKING:
    from .tree import Tree

__all__ = [
    "GENERATED_KINDS",
    "BlockRef",
    "GenSettings",
    "ImagePart",
    "Kind",
    "Node",
    "NodeLike",
    "NodeResult",
    "NodeStats",
    "Status",
    "make_image",
]

Kind = Literal["system", "user", "reasoning", "final", "tool"]
Status = Literal["pending", "done", "failed"]
GENERATED_KINDS: frozenset[str] = frozenset({"reasoning", "final"})
# The fields a render reads (render_cache.signature): assigning one tells the node's tree,
# whose renders keep the node's signature until then (a node's images and tool calls, lists
# that can change in place, are read at every render).
_RENDERED = frozenset({"id", "kind", "status", "text", "name", "tool_call_id", "images",
                       "tool_calls"})


class GenSettings(BaseModel):
    """How to generate one node. `temperature=0` is greedy; `seed` makes sampling repeatable.

    The rest mirror `forkv.SamplingParams`: `min_p`, penalties over the last `penalty_context`
    tokens (1 / 0 = off), `logit_bias` (token id -> added logit); `stop` is a string or a list.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_context: int = Field(20, ge=1)
    logit_bias: dict[int, float] = {}
    # Structured output and tools: `constraint` forces the text's shape; `tool_choice` is
    # "auto", "none", "required" or a tool's name (the last two force a call).
    constraint: Constraint | None = None
    tool_choice: str = Field("auto", pattern=r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
    parallel_tool_calls: bool = True
    # Draft tokens and verify them (the same tokens either way): "auto" where it is exact and
    # pays, "on" wherever it is exact, "off"; None: the engine's setting.
    speculate: Literal["auto", "on", "off"] | None = None

    @property
    def forces_call(self) -> bool:
        return self.tool_choice not in ("auto", "none")

    def __hash__(self) -> int:  # frozen settings hash by value; logit_bias is a dict
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                          for v in self.__dict__.values()))

    @classmethod
    def of(cls, gen: GenSettings | dict | None, node_id: str | None = None) -> GenSettings | None:
        """`gen` as settings; a bad dict raises `GraphError` naming the node and the field."""
        if not isinstance(gen, dict):
            return gen
        try:
            return cls(**gen)
        except ValidationError as e:
            where = f"node {node_id!r}: " if node_id else ""
            msg = validation_message(e, "generation setting", fields=cls.model_fields)
            raise GraphError(where + msg, node_id) from None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


_MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
]


def _sniff_mime(data: bytes, path: str | None) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    guess = mimetypes.guess_type(path)[0] if path else None
    return guess or "application/octet-stream"


class ImagePart(BaseModel):
    """An image in a node: sha256 of its bytes (taken at build time), mime, and where it lives.

    `data` is kept only when the bytes were given inline; otherwise `path` is read again at run
    time and checked against `sha256` by `load_bytes()`.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    mime: str = "application/octet-stream"
    path: str | None = None
    data: bytes | None = None

    @classmethod
    def from_path(cls, path: str | Path) -> ImagePart:
        data = Path(path).read_bytes()
        if _sniff_mime(data, None) == "application/octet-stream":
            raise GraphError(f"image {str(path)!r} is not a PNG, JPEG, GIF, BMP or WebP file "
                             "(its first bytes say so); fix the path or convert the image.")
        return cls(
            sha256=hashlib.sha256(data).hexdigest(),
            mime=_sniff_mime(data, str(path)),
            path=str(path),
        )

    @classmethod
    def from_bytes(cls, data: bytes, mime: str | None = None) -> ImagePart:
        return cls(
            sha256=hashlib.sha256(data).hexdigest(),
            mime=mime or _sniff_mime(data, None),
            data=bytes(data),
        )

    def load_bytes(self, node_id: str | None = None) -> bytes:
        """The image bytes, verified against `sha256` (a changed file must not be reused)."""
        if self.data is not None:
            data = self.data
        elif self.path is not None:
            try:
                data = Path(self.path).read_bytes()
            except OSError as e:
                raise GraphError(
                    f"image {self.path!r} of node {node_id!r} cannot be read "
                    f"({e.strerror}); restore the file or rebuild the node.",
                    node_id,
                ) from e
        else:
            raise GraphError(
                f"image {self.sha256[:12]} of node {node_id!r} has neither bytes "
                "nor a path; rebuild the node with the image.",
                node_id,
            )
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise GraphError(
                f"image {self.path or self.sha256[:12]!r} of node {node_id!r} changed "
                "since the node was built; rebuild the node with the new image.",
                node_id,
            )
        return data


def make_image(image: str | Path | bytes | ImagePart) -> ImagePart:
    """An `ImagePart` from a path, raw bytes, or an existing part."""
    if isinstance(image, ImagePart):
        return image
    if isinstance(image, (bytes, bytearray, memoryview)):
        return ImagePart.from_bytes(bytes(image))
    return ImagePart.from_path(image)


class NodeStats(BaseModel):
    """Where a node's tokens came from: restored from checkpoints, prefilled, or decoded."""

    model_config = ConfigDict(extra="forbid")

    tokens_reused: int = Field(0, ge=0)
    tokens_computed: int = Field(0, ge=0)
    tokens_generated: int = Field(0, ge=0)
    tokens_drafted: int = Field(0, ge=0)  # draft tokens verified (speculation)
    tokens_accepted: int = Field(0, ge=0)  # of those, the ones the model drew itself


class NodeResult(BaseModel):
    """What running a node produced."""

    model_config = ConfigDict(extra="forbid")

    text: str
    token_ids: list[int] = []
    finish_reason: str | None = None
    timings: dict[str, float] = {}
    stats: NodeStats = NodeStats()


class BlockRef(BaseModel):
    """A block overlapping a node's span: its index on the path and its key (hex) if full."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    key: str | None = None


class Node(BaseModel):
    """One turn of a conversation tree.

    Given nodes (system, user, tool, and reasoning/final built with `text=`) are `done` at
    once. Nodes built with `gen` settings are `pending` until `Tree.attach` stores the
    generated text in `text` and the details in `result`. `span` and `blocks` are the token
    span and covering blocks from the last `Tree.record_render` of a path through the node;
    `turn_keys` the keys of the engine's turn-end checkpoints right after its tokens.
    `copied_from` names the node a prune copied this one from (text kept verbatim).
    `tools` are the tools declared here (seen by every node below); `tool_calls` the calls a
    final node made (parsed from its text once generated); `tool_call_id` the call a tool
    node answers.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    parent_id: str | None = None
    kind: Kind
    text: str | None = None
    images: list[ImagePart] = []
    name: str | None = None
    gen: GenSettings | None = None
    status: Status = "done"
    result: NodeResult | None = None
    error: str | None = None
    span: tuple[int, int] | None = None
    blocks: list[BlockRef] = []
    turn_keys: list[str] = []
    copied_from: str | None = None
    meta: dict[str, Any] = {}
    tools: list[ToolSpec] = []
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None

    _tree: Any = PrivateAttr(default=None)

    def __repr__(self) -> str:
        return f"Node(id={self.id!r}, kind={self.kind!r}, status={self.status!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in _RENDERED:  # its tree's renders read it: their kept signature is stale
            tree = (self.__pydantic_private__ or {}).get("_tree")
            if tree is not None:
                tree._forget_signature(self.id)

    # -- state -------------------------------------------------------------------------

    @property
    def is_pending(self) -> bool:
        """True while the node still has to be generated (pending, or failed and not redone)."""
        return self.status != "done"

    @property
    def is_generated(self) -> bool:
        return self.gen is not None

    @property
    def tree(self) -> Tree:
        if self._tree is None:
            raise GraphError(
                f"node {self.id!r} belongs to no tree; build nodes through a Tree.", self.id
            )
        return self._tree

    @property
    def parent(self) -> Node | None:
        return self.tree.parent(self)

    @property
    def children(self) -> list[Node]:
        return self.tree.children(self)

    def path(self) -> list[Node]:
        """Nodes from the root down to this one."""
        return self.tree.path(self)

    # -- builders (delegate to the tree) -----------------------------------------------

    def user(
        self,
        text: str,
        images: list[Any] = (),
        *,
        id: str | None = None,
        meta: dict[str, Any] | None = None,
        tools: list[Any] = (),
    ) -> Node:
        """Add a user turn under this node; `tools` (functions, pydantic models, OpenAI tool
        dicts) are declared for every node below."""
        return self.tree.add(self, "user", text, images=images, id=id, meta=meta, tools=tools)

    def reasoning(
        self,
        gen: GenSettings | dict | None = None,
        *,
        text: str | None = None,
        id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Node:
        """Add a reasoning node: generated with `gen` (default settings), or given `text`."""
        return self.tree.add(self, "reasoning", text, gen=gen, id=id, meta=meta)

    def final(
        self,
        gen: GenSettings | dict | None = None,
        *,
        text: str | None = None,
        id: str | None = None,
        meta: dict[str, Any] | None = None,
        tool_calls: list[Any] = (),
    ) -> Node:
        """Add a final answer: generated with `gen` (default settings), or given `text` (and
        the `tool_calls` it made). `gen={"tool_choice": "required"}` forces a tool call."""
        return self.tree.add(self, "final", text, gen=gen, id=id, meta=meta,
                             tool_calls=tool_calls)

    def tool(
        self,
        text: str,
        *,
        name: str | None = None,
        id: str | None = None,
        meta: dict[str, Any] | None = None,
        call: ToolCall | str | None = None,
    ) -> Node:
        """Add a tool result under this (final) node; `call` is the `ToolCall` (or its id) it
        answers, which also names the tool."""
        if isinstance(call, ToolCall):
            name, call = name or call.name, call.id
        return self.tree.add(self, "tool", text, name=name, id=id, meta=meta, tool_call_id=call)

    def fork(self, k: int | None = None, kind: str = "reasoning", **kw: Any) -> list[Node]:
        """Add k generated siblings under this node; see `Tree.fork`."""
        return self.tree.fork(self, k, kind=kind, **kw)


# What tree operations take: a node, or its id. Declared beside Node so the Tree and its
# mixins, the planner and the renderer all import it from here (one-way: nothing imports tree).
NodeLike = Node | str
