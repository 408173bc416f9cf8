"""A response's generated nodes, run one after the other through the SDK's node runner.

A thinking model's response is two nodes, reasoning then final, and they run as two engine
requests, as Session runs them, not as one request whose text is split at the close tag
afterwards: each node then gets its own `NodeStats` and exact token span (the answer's prompt
is the template's rendering of the thought, as every later turn sees it), and the request's
stop strings, tool choice and output format apply to the answer, not to the thought. The
second request restores what the first left (checkpoints, or its live cache under fast reuse).
The wire does not change: `max_output_tokens` bounds both nodes together (the answer gets what
the thought left; none: it ends at once with `length`), `usage` counts the first prompt and
its cached tokens once and sums the generated tokens, the metrics time the first token once.

What a generated node means (text, token ids, stats, tool calls) is `forkv.runner.NodeRun`'s;
this module runs nodes from the event loop and writes the Responses body. The tree work of a
node (rendering its prompt, its path's keys, the drafts; attaching the result and rendering the
whole path) runs in a worker thread, one at a time per tree (`tree_work`), so that a deep
conversation never holds up another client's stream; a render extends its parent's
(`forkv.graph.render`), so each costs about the turn's own tokens. Knows no SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from forkv.engine import GenerationEvent, Timings
from forkv.graph import Job, render
from forkv.runner import NodeEvent, NodeRun, path_images, sampling_params, tree_drafts
from forkv.tools import call_content

from .conversations import Stored
from .generation import events, start
from .tools import response_call_items

__all__ = ["Cancelled", "ResponseRun", "message_item", "reasoning_item", "tree_lock",
           "tree_work"]

T = TypeVar("T")
_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_locks_lock = threading.Lock()


def tree_lock(tree) -> threading.Lock:
    """The lock that the work on `tree` (adding, rendering, attaching, removing) holds."""
    with _locks_lock:
        return _locks.setdefault(tree, threading.Lock())


async def tree_work(tree, fn: Callable[..., T], *args) -> T:
    """`fn(*args)` in a worker thread, holding `tree`'s lock (its renders, attaches and key
    records run one at a time; the event loop never waits on them)."""
    lock = tree_lock(tree)

    def locked() -> T:
        with lock:
            return fn(*args)

    return await asyncio.to_thread(locked)


class Cancelled(Exception):
    """The client went away (or the engine cancelled the request)."""


class ResponseRun:
    """The generated nodes (`gen_ids`) of one stored response, run in order (module doc)."""

    def __init__(self, state, stored: Stored, keep: bool, gen_ids: list[str], t0: float):
        self.state, self.stored, self.keep, self.gen_ids, self.t0 = (state, stored, keep,
                                                                     gen_ids, t0)
        self.tree = state.conversations.tree(stored.namespace)
        self.handles: list = []
        self.last: dict[str, NodeEvent] = {}  # each node's last event (stats, finish reason)
        self.streaming = self.cancelled = self.finished = False
        self._first: tuple[Job, object] | None = None

    @property
    def thinks(self) -> bool:
        return len(self.gen_ids) > 1

    def _job(self, node_id: str, max_tokens: int | None = None) -> Job:
        node = self.tree[node_id]
        gen = node.gen if max_tokens is None else node.gen.model_copy(
            update={"max_tokens": max_tokens})
        prompt = render(self.tree, node_id, self.state.lm.tokenizer, self.state.format,
                        template_kwargs=self.state.template_kwargs)
        return Job(node_id, node.kind, 0, gen, (), prompt)

    def _prepare(self, node_id: str, max_tokens: int | None = None):
        """(Job, images, drafts) of a node to submit: tree work, run in `tree_work`."""
        return (self._job(node_id, max_tokens), path_images(self.tree, node_id) or None,
                tree_drafts(self.tree, node_id))

    def _node_run(self, job: Job, call_prefix: str | None = None) -> NodeRun:
        return NodeRun(self.state.backend.engine, self.tree, job, job.prompt, self.state.format,
                       self.state.template_kwargs, self.stored.namespace, call_prefix)

    async def _submit(self, node_id: str, max_tokens: int | None = None):
        job, images, drafts = await tree_work(self.tree, self._prepare, node_id, max_tokens)
        [handle] = await start(self.state, job.prompt.token_ids, sampling_params(job.gen),
                               self.stored.namespace, images,
                               max_param="max_output_tokens", follow_up=bool(self.handles),
                               speculate=job.gen.speculate, drafts=drafts)
        self.handles.append(handle)
        if self.cancelled:  # the client left while it was being submitted
            self.cancel()
        return job, handle

    async def begin(self) -> None:
        """Render and submit the first node, so that a refusal (400, 429) is the request's."""
        self._first = await self._submit(self.gen_ids[0])

    async def nodes(self) -> AsyncIterator[NodeEvent]:
        """Every node's `NodeEvent`s in turn, results attached as each ends; `Cancelled` if
        the client went away. Call `begin` first."""
        assert self._first is not None, "begin() submits the first node"
        left = self.tree[self.gen_ids[-1]].gen.max_tokens  # max_output_tokens, for all nodes
        for i, node_id in enumerate(self.gen_ids):
            if self.cancelled:
                raise Cancelled
            if i == 0:
                job, handle = self._first
            elif left <= 0:  # the thought spent the budget: the answer ends at once
                self.last[node_id] = await tree_work(self.tree, self._spent, node_id)
                yield self.last[node_id]
                continue
            else:
                job, handle = await self._submit(node_id, left)
            # NodeRun records the prompt's keys; its last event attaches and renders the path.
            run = await tree_work(self.tree, self._node_run, job,
                                  f"call_{node_id}_{uuid.uuid4().hex[:6]}")  # unique anywhere
            async with contextlib.aclosing(events(self.state, handle, self.t0,
                                                  follow_up=i > 0)) as stream:
                async for event in stream:
                    if event.finish_reason == "cancelled":
                        raise Cancelled
                    if event.finish_reason is None:
                        yield run.feed(event)
                        continue
                    out = await tree_work(self.tree, run.feed, event)
                    self.last[node_id] = out
                    left -= out.stats.tokens_generated
                    yield out

    def _spent(self, node_id: str) -> NodeEvent:
        job = self._job(node_id)
        return self._node_run(job).feed(
            GenerationEvent("", [], [], "length", Timings(prompt_tokens=job.prompt.num_tokens)))

    def cancel(self) -> None:
        """Stop the response: the running node's request, and no node after it."""
        self.cancelled = True
        for h in self.handles:
            if not h.done:
                self.state.metrics.cancel()
                h.cancel()

    async def watch(self, request, every: float = 0.25) -> None:
        """Cancel when the client of a non-streaming request goes away."""
        while not self.finished:
            if await request.is_disconnected():
                self.cancel()
                return
            await asyncio.sleep(every)

    def finish(self) -> dict:
        """Write the attached nodes into the response body (and drop them if not stored)."""
        self.finished = True
        tree, body, stored = self.tree, self.stored.body, self.stored
        final = tree[self.gen_ids[-1]]
        content = call_content(self.state.lm.tokenizer, final).lstrip("\n")
        rid = stored.id.removeprefix("resp_")
        items = [reasoning_item(rid, tree[self.gen_ids[0]].text or "")] if self.thinks else []
        calls = response_call_items(final.tool_calls)
        # function_call items follow the message (kept if it has text or was streamed)
        if content or not calls or self.streaming:
            items.append(message_item(rid, content))
        body["output"] = items + calls
        reason = "max_output_tokens" if self.last[final.id].finish_reason == "length" else None
        body["status"] = "incomplete" if reason else "completed"
        body["incomplete_details"] = {"reason": reason} if reason else None
        stats = [self.last[n].stats for n in self.gen_ids]
        prompt, generated = len(self.handles[0].prompt_tokens), \
            sum(s.tokens_generated for s in stats)
        body["usage"] = {"input_tokens": prompt,
                         "input_tokens_details": {"cached_tokens": stats[0].tokens_reused},
                         "output_tokens": generated,
                         "output_tokens_details": {"reasoning_tokens":
                                                   stats[0].tokens_generated if self.thinks
                                                   else 0},
                         "total_tokens": prompt + generated}
        stored.done = True
        if not self.keep:  # the node runner recorded the path's keys: DELETE can release them
            self.abandon()
        return body

    def abandon(self) -> None:
        """Remove this response's nodes and release the checkpoints only they used."""
        self.finished = True
        stored = self.stored
        try:
            with tree_lock(self.tree):  # at most one render of this tree to wait for
                _, keys = self.state.conversations.remove(stored.namespace, stored.first)
        except Exception:  # noqa: BLE001 - already removed (a DELETE got there first)
            return
        self.state.backend.release(keys, stored.namespace)


def reasoning_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}] if status == "completed" else []}
