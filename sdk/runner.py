"""Running one planned node: prompt tokens in, streamed `NodeEvent`s out, result into the tree.

Knows how a node's `GenSettings` map to the engine's `SamplingParams`, how the engine's timings
become per-node statistics (tokens reused from checkpoints, computed, generated), how a
reasoning node's text is cleaned of its close tag, and how a failure is recorded on the node.
Does not plan, render prompts or choose what runs together: `Session` does.
"""

from __future__ import annotations

import dataclasses
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


__all__ = ["NodeEvent", "path_images", "record_render", "run_job", "sampling_params",
           "submit_job"]


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


def record_render(engine: Engine, tree: Tree, rendered: RenderedPath,
                  namespace: str | None = None) -> None:
    """Store spans and the engine's checkpoint keys of `rendered` (blocks, turn ends) in
    `namespace` (None: the backend's own) on its nodes."""
    if rendered.images:  # the engine keys expanded image tokens and image hashes: not these
        tree.record_render(rendered, [], engine.block_size)
        return
    keys = engine.block_keys(rendered.token_ids, namespace=namespace)
    turns = engine.turn_keys(rendered.token_ids, namespace=namespace)
    tree.record_render(rendered, [k.hex() for k in keys], engine.block_size,
                       {pos: k.hex() for pos, k in turns.items()})


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
    return [part.load_bytes(n.id) for n in tree.path(node_id)[:-1] for part in n.images]


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
                         images=images or None, namespace=namespace, progress=on_chunk)


def run_job(engine: Engine, tree: Tree, job: Job, prompt: RenderedPath, fmt: ReasoningFormat,
            template_kwargs: dict | None, events: Iterator,
            namespace: str | None = None) -> Iterator[NodeEvent]:
    """Stream `job`'s node from the engine's `events` for `prompt` (see `submit_job`); attach
    the result when done.

    Any exception while generating marks the node failed and is re-raised as `NodeFailed`
    naming it; results attached before stay. Stopping the iteration early leaves the node
    pending (nothing is attached).
    """
    node_id, kind = job.node_id, job.kind
    t0 = time.perf_counter()
    parts: list[str] = []
    ids: list[int] = []
    last = None
    try:
        record_render(engine, tree, prompt, namespace)
        for event in events:
            parts.append(event.text)
            ids += event.token_ids
            if event.finish_reason is not None:
                last = event
                break
            yield NodeEvent(node_id, kind, event.text, event.token_ids, event.logprobs)
        assert last is not None and last.timings is not None, "engine stream ended early"
        text = _clean_text(kind, "".join(parts), last.finish_reason, ids[-1] if ids else None,
                           engine.lm.eos_token_ids, fmt)
        t = last.timings
        timings = {k: v for k, v in t.as_dict().items() if isinstance(v, (int, float))}
        timings["wall_s"] = time.perf_counter() - t0
        stats = NodeStats(tokens_reused=t.reused_tokens, tokens_computed=t.computed_tokens,
                          tokens_generated=t.generated_tokens)
        tree.attach(node_id, text, ids, last.finish_reason, timings, stats)
        attach_tool_calls(engine.lm.tokenizer, tree, node_id)  # a final node's tool calls
        # Spans of the whole path now that the node has text (for `forkv show` and release).
        record_render(engine, tree, render(tree, node_id, engine.lm.tokenizer, fmt,
                                           template_kwargs=template_kwargs), namespace)
    except Exception as e:
        if tree[node_id].status != "done":
            tree.fail(node_id, f"{type(e).__name__}: {e}")
        raise NodeFailed(
            f"node {node_id!r} failed while generating ({type(e).__name__}: {e}); results "
            f"computed before it are kept - fix the cause, then tree.reset({node_id!r}) and "
            "run again.",
            node_id,
        ) from e
    yield NodeEvent(node_id, kind, last.text, last.token_ids, last.logprobs, last.finish_reason,
                    stats, timings)

