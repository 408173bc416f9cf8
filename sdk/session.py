"""The Session: what agent code holds - one conversation tree, one engine, and `run`.

Knows how to compute a tree: plan the pending nodes the targets depend on (`forkv.graph.plan`
waves), render each prompt with the model's chat template, run the jobs of a wave through one
seam (`_run_wave`), and attach results with per-node statistics. Checks before running that
the tree belongs to this model and that no image reaches a text-only model. Does not know how
caches are checkpointed (the engine) or how trees are built and validated (the graph).
"""

from __future__ import annotations

import asyncio
import operator
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from forkv.engine import Engine
from forkv.engine.errors import ContextTooLong, check_context
from forkv.engine.models.chat_template import require_chat_template
from forkv.graph import (
    ContextOverflow,
    ImageNotSupported,
    Job,
    Node,
    ReasoningFormat,
    RenderedPath,
    Tree,
    WorkflowSpec,
    plan,
    render,
)

from .backend import Backend
from .runner import NodeEvent, node_failed, reasoning_format, run_job, submit_job

__all__ = ["Session"]

Targets = Node | str | Iterable[Node | str] | None
_images = operator.attrgetter("images")


class Session:
    """Runs a conversation tree on one model, reusing every checkpointed token prefix.

    `model` is a model name (`"demo:gemma3"`, a folder), a loaded model, or an `Engine` (then
    engine settings belong to that engine). Engine settings: `config` (a
    `forkv.engine.EngineConfig`) or its fields as keywords — `settings` (a
    `forkv.security.StoreSettings`) configures the checkpoint tiers, `block_size`,
    `checkpoints`, `max_seqs`...; `namespace` (a tenant) puts every request of the session in
    that checkpoint namespace, also on an engine other sessions share (it restores only what
    that namespace recorded, and batches with everyone); `chat_template` (Jinja text
    or a file) for a model that ships none (a base model). Build the tree with
    `session.system(...)`/`session.user(...)` or pass `tree=`; `run()` computes it. `ui=True`
    prints a loopback URL where the tree grows as its nodes run (`forkv run --ui`'s viewer).
    Close the session (or use `with`) to release its engine.
    """

    def __init__(self, model: Any, config: Any = None, *, tree: Tree | None = None,
                 reasoning: ReasoningFormat | None = None,
                 template_kwargs: dict[str, Any] | None = None, namespace: str | None = None,
                 ui: bool = False, **engine_settings: Any):
        self.namespace = namespace
        self.viewer = None  # with ui=True: the page where the tree grows (run_viewer.py)
        if isinstance(model, Engine) or _is_backend(model):
            if config is not None or any(v is not None for v in engine_settings.values()):
                raise TypeError("Engine settings configure a new engine; pass them to "
                                "Engine(...) instead of an engine that already exists.")
            self.engine, self._owns_engine = model, False
        else:
            if config is not None and not hasattr(config, "block_size"):
                # The old positional form: Session(model, StoreSettings).
                engine_settings["settings"], config = config, None
            self.engine = Engine(model, config, **engine_settings)
            self._owns_engine = True
        # the model's own thinking tags (the server uses the same), `<think>` if it has none
        self.reasoning = reasoning or reasoning_format(
            getattr(getattr(self.engine, "lm", None), "tokenizer", None))
        self.template_kwargs = dict(template_kwargs or {})
        try:
            self.tree = tree if tree is not None else Tree(model_id=self.model_id)
            self._check_model()
        except Exception:
            self.close()
            raise
        self._logprobs: dict[str, list[float]] = {}
        self._lock = threading.RLock()  # one run at a time: runs edit the tree
        if ui:
            self._start_viewer()

    def _start_viewer(self) -> None:
        from .server.run_viewer import RunViewer

        self.viewer = RunViewer("forkv session", self.model_id)
        print(f"forkv: this session's tree grows at {self.viewer.start()}", file=sys.stderr,
              flush=True)
        self.viewer.publish(self.tree)

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
        lm = getattr(self.engine, "lm", None)
        if getattr(lm, "tokenizer", None) is not None:  # trees render through the template
            require_chat_template(lm.tokenizer, lm.name)
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
        self.engine.release([bytes.fromhex(k) for k in keys])
        for node_id in removed:
            self._logprobs.pop(node_id, None)
        return removed

    def save(self, path: str | Path) -> None:
        """Save the tree as JSON (results, stats and spans included) to a private file
        (0600, yours, not a symlink, in a folder other users cannot rewrite)."""
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
    def run(self, targets: Targets = None, *, progress=None) -> list[Node]:
        """Compute every pending node `targets` depend on (default: all pending nodes).

        Returns the nodes computed, in order. A node that fails is marked failed and raises
        `NodeFailed` naming it; nodes computed before it keep their results. `progress(node_id,
        computed, total, restored)` is called (on the engine thread) as prompts prefill.
        """
        done = [ev.node_id for ev in self.stream(targets, progress=progress) if ev.is_last]
        return [self.tree[n] for n in done]

    def stream(self, targets: Targets = None, *, progress=None) -> Iterator[NodeEvent]:
        """Like `run`, yielding each node's tokens as `NodeEvent`s (the last one with stats)."""
        with self._lock:
            self._check_model()
            waves = plan(self.tree, _as_list(targets), self.engine.lm.tokenizer, self.reasoning,
                         context_length=self.engine.lm.context_length,
                         template_kwargs=self.template_kwargs)
            self._check_images(waves)
            publish = self.viewer.publish if self.viewer is not None else None
            if publish:
                publish(self.tree)
            for wave in waves:
                for job in wave:
                    if job.prompt is None:
                        job.prompt = self._render_job(job)
                for event in self._run_wave(wave, progress):
                    if publish and event.is_last:
                        publish(self.tree)  # (a snapshot, taken on the thread that runs)
                    yield event

    def _run_wave(self, jobs: list[Job], progress=None) -> Iterator[NodeEvent]:
        """Run the independent jobs of one wave (no job depends on another of its wave).

        Every job is submitted to the engine at once, so they compute together in its
        continuous batch (a fork's branches restore the prefix the first one prefills); events
        come out node by node.
        """
        handles, failed = [], None
        for job in jobs:
            self._logprobs[job.node_id] = []  # a retried node starts over
            try:
                handles.append(submit_job(self.engine, self.tree, job, progress,
                                          self.namespace))
            except Exception as e:  # noqa: BLE001 - reported as this node's failure below
                failed = (job, e)
                break
        try:
            for job, handle in zip(jobs, handles):
                yield from self._events_of(job, handle.stream())
        finally:
            for handle in handles:  # a consumer that stops early frees the rows
                handle.cancel()
        if failed is not None:
            job, error = failed
            raise node_failed(self.tree, job.node_id, error) from error

    def _events_of(self, job: Job, events) -> Iterator[NodeEvent]:
        for event in run_job(self.engine, self.tree, job, job.prompt, self.reasoning,
                             self.template_kwargs, events, self.namespace):
            self._logprobs[job.node_id].extend(event.logprobs)
            yield event

    def _render_job(self, job: Job) -> RenderedPath:
        prompt = self.prompt(job.node_id)
        try:
            check_context(self.engine.lm, prompt.num_tokens, job.gen.max_tokens)
        except ContextTooLong as e:
            raise ContextOverflow(
                f"node {job.node_id!r} needs {e.prompt_tokens + e.max_tokens} tokens (prompt "
                f"{e.prompt_tokens} + max_tokens {e.max_tokens}) but the context holds "
                f"{e.limit}; lower max_tokens or prune the path.", job.node_id) from None
        return prompt

    def _check_images(self, waves: list[list[Job]]) -> None:
        if self.can_see_images:
            return
        for wave in waves:
            for job in wave:
                path = self.tree.path(job.node_id)
                for n in path if any(map(_images, path)) else ():  # (checked in C first)
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
    async def arun(self, targets: Targets = None, *, progress=None) -> list[Node]:
        """`run` without blocking the event loop: planning and rendering run in a worker
        thread, the model on the engine's own thread."""
        return await asyncio.to_thread(self.run, targets, progress=progress)

    async def astream(self, targets: Targets = None, *,
                      progress=None) -> AsyncIterator[NodeEvent]:
        """`stream` for asyncio: events arrive as the model produces them; leaving the loop
        early cancels what is still running."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        end = object()

        def work() -> None:
            try:
                for event in self.stream(targets, progress=progress):
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
        """Release the engine's store (a persistent one writes its index) if we made it, and
        stop the viewer of `ui=True`."""
        if self.viewer is not None:
            self.viewer.close()
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> Session:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_backend(obj: Any) -> bool:
    """Any `forkv.backend.Backend` (e.g. `forkv.remote(...)`) serves as the engine."""
    return isinstance(obj, Backend)


def _as_list(targets: Targets) -> list[Node | str] | None:
    if targets is None:
        return None
    if isinstance(targets, (Node, str)):
        return [targets]
    return list(targets)
