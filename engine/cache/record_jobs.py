"""Record jobs: prefill-only runs that make canonical the blocks a request reached another way.

A state reached by decoding, or by continuing a live cache off the canonical cuts, rounds
differently from a block-aligned prefill of the same tokens, so its blocks are recorded by a
job that prefills those tokens canonically through the usual recorder. Jobs are scheduled work
owned by the prefix cache: one chunk runs in a step when the engine has nothing else to do, or
at once when a waiting exact request starts with blocks a job would record (that request then
restores them), so no row ever stalls for another row's records. An engine that is never idle
runs few jobs, so the queue keeps the newest `MAX_QUEUED` (a job dropped is blocks left
unrecorded: a later miss, never wrong output; a 12-minute soak queued ~630 and growing). Knows
nothing about batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .blocks import shared_prefix

MAX_QUEUED = 64


@dataclass(slots=True, eq=False)
class RecordJob:
    seq: object  # a prefill-only Sequence of the tokens to record
    first_block: int  # the first block it exists to record


class RecordJobs:
    """The queue of record jobs and the one prefilling now."""

    def __init__(self, make_seq: Callable, match: Callable, is_recorded: Callable,
                 writes: Callable, block_size: int):
        self.make_seq = make_seq  # (tokens, keyer) -> a prefill-only Sequence with its plan
        self.match = match  # restores what is recorded already into a job's sequence
        self.is_recorded = is_recorded  # whether a job has nothing left to record
        self.writes = writes  # the checkpoint keys a job's sequence records under
        self.block_size = block_size
        self.queue: deque[RecordJob] = deque()
        self.current: RecordJob | None = None

    def __len__(self) -> int:
        return len(self.queue) + (self.current is not None)

    def add(self, tokens: list[int], first_block: int, keyer) -> None:
        self.queue.append(RecordJob(self.make_seq(tokens, keyer), first_block))
        while len(self.queue) > MAX_QUEUED:  # the oldest conversation is the least likely
            self.queue.popleft()

    def run(self, waiting, idle: bool) -> int:
        """One chunk of a job, when the engine is `idle` or a `waiting` request starts with
        blocks the job records (a started job otherwise pauses); the tokens computed."""
        while self.current is None and self.queue:
            self.current = self.queue.popleft() if idle else self._needed_job(waiting)
            if self.current is None:
                return 0
            if self.is_recorded(self.current.seq):
                self.current = None
            else:
                self.match(self.current.seq)
        job = self.current
        if job is None or not (idle or self._needed(job, waiting)):
            return 0
        seq, n = job.seq, 0
        if seq.is_prefilling:
            n = seq.next_chunk(self.block_size)
            seq.prefill_chunk(seq.model, self.block_size)
        if not seq.is_prefilling:
            seq.cache, self.current = None, None
        return n

    def _needed(self, job: RecordJob, waiting) -> bool:
        # (fast requests continue live caches rather than wait for records)
        return any(shared_prefix(s.plan.keys, job.seq.plan.keys) > job.first_block
                   for s in waiting if not s.plan.fast)

    def _needed_job(self, waiting) -> RecordJob | None:
        """A queued job whose blocks some waiting request starts with."""
        job = next((j for j in self.queue if self._needed(j, waiting)), None)
        if job is not None:
            self.queue.remove(job)
        return job

    def drop(self, keys: frozenset) -> None:
        """Forget the jobs that would write a checkpoint under any of `keys` (released)."""
        for job in [j for j in self.queue if not keys.isdisjoint(self.writes(j.seq))]:
            self.queue.remove(job)
        if self.current is not None and not keys.isdisjoint(self.writes(self.current.seq)):
            self.current.seq.cache, self.current = None, None

    def clear(self) -> None:
        self.queue.clear()
        self.current = None
