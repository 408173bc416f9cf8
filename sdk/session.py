"""The Session: what agent code holds - one conversation tree, one engine, and `run`.

Knows how to compute a tree: plan the pending nodes the targets depend on (`forkv.graph.plan`
waves), render each prompt with the model's chat template, run the jobs of a wave through one
seam (`_run_wave`), and attach results with per-node statistics. Checks before running that
the tree belongs to this model and that no image reaches a text-only model. Does not know how
caches are checkpointed (the engine) or how trees are built and validated (the graph).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from forkv.engine import DEFAULT_BLOCK_SIZE, CacheKind, Engine
from forkv.graph import (
    ContextOverflow,
    ImageNotSupported,
    Job,
    Node,
    NodeFailed,
    ReasoningFormat,
    RenderedPath,
    Tree,
    WorkflowSpec,
    plan,
    render,
)

from .runner import NodeEvent, run_job, sampling_params

__all__ = ["Session"]

Targets = Node | str | Iterable[Node | str] | None


class Session:
    """Runs a conversation tree on one model, reusing every checkpointed token prefix.

    `model` is a model name (`"demo:gemma3"`, a folder), a loaded model, or an `Engine` (then
    `settings`/`namespace` belong to that engine). `settings` (a
    `forkv.security.StoreSettings`) configures the checkpoint tiers; `namespace` salts block
    keys per tenant. Build the tree with `session.system(...)`/`session.user(...)` or pass
    `tree=`; `run()` computes it. Close the session (or use `with`) to release its store.
    """

    def __init__(self, model: Any, settings: Any = None, namespace: str = "", *,
                 tree: Tree | None = None, reasoning: ReasoningFormat | None = None,
                 template_kwargs: dict[str, Any] | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, checkpoints: bool = True):
        if isinstance(model, Engine):
            if settings is not None or namespace:
                raise TypeError("settings and namespace configure a new engine; pass them to "
                                "Engine(...) instead of an engine that already exists.")
            self.engine, self._owns_engine = model, False
        else:
            self.engine = Engine(model, block_size, settings=settings, namespace=namespace,
                                 checkpoints=checkpoints)
            self._owns_engine = True
        self.reasoning = reasoning or ReasoningFormat()
        self.template_kwargs = dict(template_kwargs or {})
        self.tree = tree if tree is not None else Tree(model_id=self.model_id)
        try:
            self._check_model()
        except Exception:
            self.close()
            raise
        self._logprobs: dict[str, list[float]] = {}
        self._batch = None  # the continuous-batching engine, made on the first wide wave
        self._lock = threading.RLock()  # one run at a time: the engine is not thread-safe

    def __repr__(self) -> str:
        return f"Session(model_id={self.model_id!r}, tree={self.tree!r})"

    # -- the model ---------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        """The engine's model as trees record it: name plus a fingerprint prefix."""
        return f"{self.engine.lm.name}@{self.engine.lm.fingerprint.hex()[:12]}"

    @property
    def can_see_images(self) -> bool:
        return bool(getattr(self.engine.lm, "is_vision", False))

    def _check_model(self) -> None:
        mine, theirs = self.model_id, self.tree.model_id
        if theirs is None:
            self.tree.model_id = mine
        elif theirs.rpartition("@")[2] != mine.rpartition("@")[2]:
            # Same fingerprint under another name (a moved folder) is the same model.
            self.tree.check_model(mine)

    # -- building (delegates to the tree) ----------------------------------------------------
    def system(self, text: str, **kw: Any) -> Node:
        """Start a conversation with a system prompt."""
        return self.tree.system(text, **kw)

    def user(self, text: str, images: Sequence[Any] = (), **kw: Any) -> Node:
        """Start a conversation with a user turn."""
        return self.tree.user(text, images, **kw)

    def remove(self, node: Node | str) -> list[str]:
        """Remove `node`'s subtree and release the checkpoints only it used; return the ids."""
        keys = self.tree.keys_only_in(node)
        removed = self.tree.remove(node)
        store = self.engine.store
        if store is not None:
            for key in keys:
                for kind in CacheKind:
                    store.discard(bytes.fromhex(key), kind)
        for node_id in removed:
            self._logprobs.pop(node_id, None)
        return removed

    def save(self, path: str | Path) -> None:
        """Save the tree as JSON (results, stats and spans included)."""
        self.tree.save(path)

    def load(self, path: str | Path) -> Tree:
        """Load a saved tree into this session; it must have been made with this model."""
        tree = Tree.load(path)
        self._adopt(tree)
        return tree

    def _adopt(self, tree: Tree) -> None:
        """Make `tree` this session's tree if it was made with this model; else keep the old."""
        old, self.tree = self.tree, tree
        try:
            self._check_model()
        except Exception:
            self.tree = old
            raise

    # -- rendering ---------------------------------------------------------------------------
    def prompt(self, node: Node | str) -> RenderedPath:
        """The rendered path to `node`: its prompt if pending, else the whole path."""
        return render(self.tree, node, self.engine.lm.tokenizer, self.reasoning,
                      template_kwargs=self.template_kwargs)

    def mean_logprob(self, node: Node | str) -> float:
        """Mean logprob of a node's generated tokens in this session (a ready-made scorer)."""
        node_id = node.id if isinstance(node, Node) else node
        lps = self._logprobs.get(node_id)
        if not lps:
            raise KeyError(f"node {node_id!r} was not generated in this session; run it first.")
        return sum(lps) / len(lps)

    # -- running -----------------------------------------------------------------------------
    def run(self, targets: Targets = None) -> list[Node]:
        """Compute every pending node `targets` depend on (default: all pending nodes).

        Returns the nodes computed, in order. A node that fails is marked failed and raises
        `NodeFailed` naming it; nodes computed before it keep their results.
        """
        done = [ev.node_id for ev in self.stream(targets) if ev.is_last]
        return [self.tree[n] for n in done]

    def stream(self, targets: Targets = None) -> Iterator[NodeEvent]:
        """Like `run`, yielding each node's tokens as `NodeEvent`s (the last one with stats)."""
        with self._lock:
            self._check_model()
            waves = plan(self.tree, _as_list(targets), self.engine.lm.tokenizer, self.reasoning,
                         context_length=self.engine.lm.context_length,
                         template_kwargs=self.template_kwargs)
            self._check_images(waves)
            for wave in waves:
                for job in wave:
                    if job.prompt is None:
                        job.prompt = self._render_job(job)
                yield from self._run_wave(wave)

    def _run_wave(self, jobs: list[Job]) -> Iterator[NodeEvent]:
        """Run the independent jobs of one wave (no job depends on another of its wave).

        Several text jobs run together on the continuous-batching engine; events come out
        node by node while all of them compute. The first job is prefilled before the others
        join, so forks that share its prefix restore it from its checkpoints instead of each
        computing it again.
        """
        for job in jobs:
            self._logprobs[job.node_id] = []  # a retried node starts over
        if len(jobs) < 2 or any(self.tree[n].images for j in jobs for n in
                                (p.id for p in self.tree.path(j.node_id))):
            for job in jobs:
                yield from self._events_of(job, None)
            return
        batch = self._batch_engine()
        handles, failed = [], None
        for i, job in enumerate(jobs):
            try:
                handles.append(batch.submit(job.prompt.token_ids, sampling_params(job.gen)))
            except Exception as e:  # noqa: BLE001 - reported as this node's failure below
                failed = (job, e)
                break
            if i == 0:
                while batch.num_waiting or batch.num_prefilling:
                    batch.step()
        try:
            for job, handle in zip(jobs, handles):
                yield from self._events_of(job, handle.stream())
        finally:
            for handle in handles:  # a consumer that stops early frees the rows
                if not handle.done:
                    handle.cancel()
        if failed is not None:
            job, error = failed
            self.tree.fail(job.node_id, f"{type(error).__name__}: {error}")
            raise NodeFailed(
                f"node {job.node_id!r} failed while generating ({type(error).__name__}: "
                f"{error}); results computed before it are kept - fix the cause, then "
                f"tree.reset({job.node_id!r}) and run again.", job.node_id) from error

    def _events_of(self, job: Job, events) -> Iterator[NodeEvent]:
        for event in run_job(self.engine, self.tree, job, job.prompt, self.reasoning,
                             self.template_kwargs, events):
            self._logprobs[job.node_id].extend(event.logprobs)
            yield event

    def _batch_engine(self):
        if self._batch is None:
            from forkv.engine import BatchEngine

            self._batch = BatchEngine(self.engine)
        return self._batch

    def _render_job(self, job: Job) -> RenderedPath:
        prompt = self.prompt(job.node_id)
        need = prompt.num_tokens + job.gen.max_tokens
        if need > self.engine.lm.context_length:
            raise ContextOverflow(
                f"node {job.node_id!r} needs {need} tokens (prompt {prompt.num_tokens} + "
                f"max_tokens {job.gen.max_tokens}) but the context holds "
                f"{self.engine.lm.context_length}; lower max_tokens or prune the path.",
                job.node_id)
        return prompt

    def _check_images(self, waves: list[list[Job]]) -> None:
        if self.can_see_images:
            return
        for wave in waves:
            for job in wave:
                for n in self.tree.path(job.node_id):
                    if n.images:
                        raise ImageNotSupported(
                            f"node {n.id!r} has an image, but model {self.engine.lm.name!r} "
                            "is text-only; remove the image or load a vision model.",
                            n.id)

    def run_workflow(self, spec: WorkflowSpec,
                     scorers: Mapping[str, Any] | None = None) -> Tree:
        """Build a declarative workflow into this session's tree (replacing it) and run it
        to the end, applying keep rules as forks finish. `scorers` may name
        `session.mean_logprob`."""
        tree = spec.build()
        if tree.model_id is None:
            tree.model_id = self.model_id
        self._adopt(tree)
        while True:
            self.run()
            if not spec.advance(self.tree, scorers or {}) and not self.tree.pending():
                return self.tree

    # -- async -------------------------------------------------------------------------------
    async def arun(self, targets: Targets = None) -> list[Node]:
        """`run` in a worker thread, so the event loop keeps going while the model computes."""
        return await asyncio.to_thread(self.run, targets)

    async def astream(self, targets: Targets = None) -> AsyncIterator[NodeEvent]:
        """`stream` in a worker thread; events arrive as the model produces them."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        end = object()

        def work() -> None:
            try:
                for event in self.stream(targets):
                    if stop.is_set():  # the consumer left: stop generating
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, (event, None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, (end, e))
            else:
                loop.call_soon_threadsafe(queue.put_nowait, (end, None))

        worker = loop.run_in_executor(None, work)
        try:
            while True:
                item, error = await queue.get()
                if error is not None:
                    raise error
                if item is end:
                    break
                yield item
        finally:
            stop.set()
            await asyncio.shield(worker)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the engine's store (a persistent one writes its index) if we made it."""
        if getattr(self, "_batch", None) is not None:
            self._batch.close()
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> Session:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_list(targets: Targets) -> list[Node | str] | None:
    if targets is None:
        return None
    if isinstance(targets, (Node, str)):
        return [targets]
    return list(targets)
