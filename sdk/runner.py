"""Running one planned node: prompt tokens in, streamed `NodeEvent`s out, result into the tree.

The one node runner: Session (and so `forkv run`) and the server's Responses API run every
generated node through `NodeRun`, which takes the engine's events from any loop, sync or
asyncio. Knows how a node's `GenSettings` map to the engine's `SamplingParams` (and back), the
model's reasoning format, how the engine's timings become per-node statistics (tokens reused
from checkpoints, computed, generated), how a reasoning node's text is cleaned of its close
tag, that a final node's tool calls are parsed on attach, and how a failure is recorded on the
node. Does not plan, render prompts or choose what runs together: `Session` does.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from forkv.engine import Engine, SamplingParams
from forkv.graph import (
    GenSettings,
    Job,
    NodeFailed,
    NodeStats,
    ReasoningFormat,
    RenderedPath,
    Tree,
    render,
)

from .tools import attach_tool_calls

__all__ = ["NodeEvent", "NodeRun", "gen_settings", "node_failed", "path_images",
           "reasoning_format", "record_render", "run_job", "sampling_params", "submit_job",
           "tree_drafts"]


@dataclass(slots=True)
class NodeEvent:
    """One streamed piece of a node: new text, token ids and their logprobs.

    The last event of a node has `finish_reason` set and carries the node's `stats` and
    `timings` (seconds and token counts, as attached to `node.result`). The attached text of a
    reasoning node leaves out the newline the template writes before its close tag.
    """

    node_id: str
    kind: str
    text: str
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stats: NodeStats | None = None
    timings: dict[str, float] | None = None

    @property
    def is_last(self) -> bool:
        return self.finish_reason is not None


_SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


def sampling_params(gen: GenSettings) -> SamplingParams:
    """The engine's settings for a node: every GenSettings field the sampler knows (max_tokens,
    temperature, top-p/k, min-p, penalties, logit bias, seed, stop, constraint)."""
    known = type(gen).model_fields
    return SamplingParams(**{k: getattr(gen, k) for k in _SAMPLING_FIELDS if k in known})


def gen_settings(params: SamplingParams, **update) -> GenSettings:
    """A node's settings from the engine's (every field both know, `update` on top): what the
    server stores on the nodes it generates. The engine's compiled constraint stays behind;
    give the graph's `Constraint` in `update`."""
    fields = {k: getattr(params, k) for k in GenSettings.model_fields
              if k in _SAMPLING_FIELDS and k != "constraint"}
    return GenSettings(**{**fields, **update})


def reasoning_format(tokenizer) -> ReasoningFormat:
    """The model's thinking format, from the tags mlx-lm finds in its tokenizer (`think_start`,
    `think_end`); `<think>` when it names none. Session and the server both use this one."""
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if start and end:
        return ReasoningFormat(open=f"{start}\n", close=f"\n{end}\n\n")
    return ReasoningFormat()


def record_render(engine: Engine, tree: Tree, rendered: RenderedPath,
                  namespace: str | None = None) -> None:
    """Store spans and the engine's checkpoint keys of `rendered` (blocks, turn ends) in
    `namespace` (None: the backend's own) on its nodes."""
    if rendered.images:  # the engine keys expanded image tokens and image hashes: not these
        tree.record_render(rendered, [], engine.block_size)
        return
    keys = engine.block_keys(rendered.token_ids, namespace=namespace)
    turns = engine.turn_keys(rendered.token_ids, namespace=namespace, block_keys=keys)
    # (hex in C: a deep path has many blocks and turn ends)
    tree.record_render(rendered, list(map(_hex, keys)), engine.block_size,
                       dict(zip(turns, map(_hex, turns.values()))))


_hex = operator.methodcaller("hex")
_images = operator.attrgetter("images")
_id = operator.attrgetter("id")


def _clean_text(kind: str, text: str, finish: str | None, last_id: int | None,
                eos_ids: frozenset[int], fmt: ReasoningFormat) -> str:
    if kind != "reasoning" or finish != "stop" or last_id in eos_ids:
        return text
    # The engine already cut the close tag; the newline before it belongs to the format, so
    # drop it too: re-rendering the node then gives back the tokens that were generated.
    lead = fmt.close[: fmt.close.find(fmt.close_tag)] if fmt.close_tag else ""
    return text[: -len(lead)] if lead and text.endswith(lead) else text


def path_images(tree: Tree, node_id: str) -> list[bytes]:
    """Bytes of the images above `node_id`, in prompt order (checked against their hashes)."""
    path = tree.path(node_id)[:-1]
    if not any(map(_images, path)):  # (checked in C: most paths have none)
        return []
    return [part.load_bytes(n.id) for n in path for part in n.images]


def submit_job(engine: Engine, tree: Tree, job: Job, progress=None,
               namespace: str | None = None):
    """Submit `job`'s rendered prompt (and the images on its path) to the engine, in
    `namespace`; its handle. `progress(node_id, computed, total, restored)` follows the
    prompt's prefill."""
    images = path_images(tree, job.node_id)
    on_chunk = None
    if progress is not None:
        def on_chunk(computed, total, restored, node_id=job.node_id):
            progress(node_id, computed, total, restored)
    if hasattr(engine, "submit_path"):  # remote backends send the path as chat messages
        return engine.submit_path(tree, job, namespace=namespace, progress=on_chunk)
    return engine.submit(job.prompt.token_ids, sampling_params(job.gen),
                         images=images or None, namespace=namespace, progress=on_chunk,
                         speculate=job.gen.speculate, drafts=tree_drafts(tree, job.node_id))


def tree_drafts(tree: Tree, node_id: str, limit: int = 8) -> list[list[int]]:
    """What a node may draft from besides its own prompt: the tokens other generated nodes of
    its tree produced off its path (its siblings first, then the newest), at most `limit`."""
    node = tree[node_id]
    path = tree.path(node)
    if len(path) == len(tree):  # a single conversation (a Session's chat): nothing else
        return []
    on_path = set(map(_id, path))
    parent = tree.parent(node)
    siblings = tree.children(parent) if parent is not None else []
    skip = on_path | {n.id for n in siblings}
    # (newest first, read as asked: a server's tree holds every conversation of a tenant)
    others = (n for n in tree.newest_first() if n.id not in skip)
    out = []
    for n in itertools.chain(siblings, others):
        if n.id in on_path or n.result is None or not n.result.token_ids:
            continue
        out.append(n.result.token_ids)
        if len(out) == limit:
            break
    return out


class NodeRun:
    """One node's generation, fed the engine's events one by one by whatever loop reads them
    (`run_job`; the server's asyncio routes): `feed` returns each as a `NodeEvent`. The last
    one attaches the result (text, ids, timings, `NodeStats`; a final node's tool calls, ids
    `call_prefix` + index, default `call_<node id>`) and records the path's spans and keys.
    Stopping early leaves the node pending; the caller decides what a failure does."""

    def __init__(self, engine: Engine, tree: Tree, job: Job, prompt: RenderedPath,
                 fmt: ReasoningFormat, template_kwargs: dict | None = None,
                 namespace: str | None = None, call_prefix: str | None = None):
        self.engine, self.tree, self.job, self.fmt = engine, tree, job, fmt
        self.template_kwargs, self.namespace = template_kwargs, namespace
        self.call_prefix = call_prefix
        self.t0 = time.perf_counter()
        self.parts: list[str] = []
        self.ids: list[int] = []
        record_render(engine, tree, prompt, namespace)

    def feed(self, event) -> NodeEvent:
        """The node's view of one engine event; the last one (finish_reason set) attaches."""
        node_id, kind = self.job.node_id, self.job.kind
        self.parts.append(event.text)
        self.ids += event.token_ids
        if event.finish_reason is None:
            return NodeEvent(node_id, kind, event.text, event.token_ids, event.logprobs)
        assert event.timings is not None, "the engine's last event has no timings"
        stats, timings = self._attach(event.finish_reason, event.timings)
        return NodeEvent(node_id, kind, event.text, event.token_ids, event.logprobs,
                         event.finish_reason, stats, timings)

    def _attach(self, finish: str, t) -> tuple[NodeStats, dict]:
        engine, tree, node_id, ids = self.engine, self.tree, self.job.node_id, self.ids
        text = _clean_text(self.job.kind, "".join(self.parts), finish, ids[-1] if ids else None,
                           engine.lm.eos_token_ids, self.fmt)
        timings = {k: v for k, v in t.as_dict().items() if isinstance(v, (int, float))}
        timings["wall_s"] = time.perf_counter() - self.t0
        stats = NodeStats(tokens_reused=t.reused_tokens, tokens_computed=t.computed_tokens,
                          tokens_generated=t.generated_tokens, tokens_drafted=t.drafted_tokens,
                          tokens_accepted=t.accepted_tokens)
        tree.attach(node_id, text, ids, finish, timings, stats)
        # a final node's tool calls
        attach_tool_calls(engine.lm.tokenizer, tree, node_id, self.call_prefix)
        # Spans of the whole path now that the node has text (for `forkv show` and release).
        record_render(engine, tree, render(tree, node_id, engine.lm.tokenizer, self.fmt,
                                           template_kwargs=self.template_kwargs), self.namespace)
        return stats, timings


def node_failed(tree: Tree, node_id: str, error: BaseException) -> NodeFailed:
    """Mark `node_id` failed (unless its result was attached) and the error to raise."""
    if tree[node_id].status != "done":
        tree.fail(node_id, f"{type(error).__name__}: {error}")
    return NodeFailed(
        f"node {node_id!r} failed while generating ({type(error).__name__}: {error}); results "
        f"computed before it are kept - fix the cause, then tree.reset({node_id!r}) and "
        "run again.",
        node_id,
    )


def run_job(engine: Engine, tree: Tree, job: Job, prompt: RenderedPath, fmt: ReasoningFormat,
            template_kwargs: dict | None, events: Iterator,
            namespace: str | None = None) -> Iterator[NodeEvent]:
    """Stream `job`'s node from the engine's `events` for `prompt` (see `submit_job`); attach
    the result when done (`NodeRun`).

    Any exception while generating marks the node failed and is re-raised as `NodeFailed`
    naming it; results attached before stay. Stopping the iteration early leaves the node
    pending (nothing is attached).
    """
    last = None
    try:
        run = NodeRun(engine, tree, job, prompt, fmt, template_kwargs, namespace)
        for event in events:
            out = run.feed(event)
            if out.is_last:
                last = out
                break
            yield out
        assert last is not None, "engine stream ended early"
    except Exception as e:
        raise node_failed(tree, job.node_id, e) from e
    yield last
