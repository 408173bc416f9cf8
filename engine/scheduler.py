"""Continuous batching: which sequences prefill, which decode, and what one step does.

A sequence waits until a slot is free (`max_seqs` caps prefilling + decoding sequences), is
restored from its checkpoints (the runner's `prepare`), prefills on its own cache in
block-aligned chunks, then joins the batch of decoding rows. Each `step()`:

1. admits waiting sequences into free slots (FIFO), except one that starts with blocks another
   sequence is prefilling right now: it waits until those blocks are recorded and then
   restores them, so forks and `n > 1` compute a shared prefix once (a fast-reuse request
   waits instead for the other's whole prompt, whose cache it then continues: live.py);
2. prefills whole chunks, round-robin over the prefilling sequences, until the step has spent
   `max_prefill_tokens` (at least one chunk, so prefill always progresses); a chunk is never
   split, since other chunk edges would change the arithmetic and make records non-canonical
   (a sequence restored whole — its prompt ends at a recorded turn end, whose record holds
   the last logits — goes straight to decoding);
3. runs one decode step for every row together, so a long prompt arriving never stalls the
   others for more than one step's prefill budget.

Before admitting, a step runs one chunk of a record job (below) if a waiting request needs its
blocks or the engine has been idle a moment.

Decode boundaries. A state reached by decoding rounds differently from a block-aligned prefill,
so its blocks are recorded by recomputing them as chunks (see `recorder.py`). For text rows
that work is deferred: a row that crosses boundaries while decoding keeps decoding, and when
it finishes, one record job (a prefill-only sequence of its tokens up to the last boundary)
is queued (as is one for a fast-reuse request's tokens when its live cache leaves the pool).
Jobs run one chunk per step once the engine has had no request for `JOB_IDLE_S`, or at once
when a waiting exact request starts with blocks a job would record (that request then
restores them), so no row ever stalls for another row's records and records nobody asks for
while the engine is busy cost nothing until it is idle. Rows of runners that cannot defer
(vision: the job would need the request's images) recompute in the step that reaches the
boundary, and the canonical state replaces the row in the batch. Knows nothing about threads,
handles, or what kind of model runs the rows (the runner does).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .batchcache import BatchCache
from .events import GenerationEvent
from .live import clone, shared_prefix
from .sampling import top_logprobs
from .sequence import Sequence


@dataclass(slots=True)
class StepReport:
    """What one step did: tokens prefilled per sequence id, rows decoded, events produced."""

    prefilled: dict[int, int] = field(default_factory=dict)
    recomputed: int = 0  # decoded tokens recomputed as chunks to record them
    decoded: int = 0  # rows that decoded one token
    events: list[tuple[Sequence, GenerationEvent]] = field(default_factory=list)
    delivered: int = 0  # events already handed to `Scheduler.deliver` during the step

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefilled.values())


@dataclass(slots=True)
class StepTotals:
    """Running totals over every step: where the engine's time went (for stats and benches)."""

    steps: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decoded_tokens: int = 0
    decode_s: float = 0.0  # batched decode steps (with any in-step boundary recompute)
    recomputed_tokens: int = 0
    record_jobs_s: float = 0.0  # deferred decode records (prefill-only jobs)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


_LIVE_WAIT_MIN = 32  # a fast request waits for another's prompt to share at least this
# Record jobs start only once no request has been in the engine for this long: a client's
# next request usually follows its last answer within milliseconds, and a job chunk that has
# started (up to a block of prefill) would hold that request back.
JOB_IDLE_S = 0.3


class Scheduler:
    def __init__(self, runner, block_size: int, max_seqs: int, max_prefill_tokens: int,
                 mergeable: bool = True, make_job=None, deliver=None):
        assert max_seqs >= 1 and max_prefill_tokens >= 1
        self.runner = runner
        self.block_size = block_size
        self.max_seqs = max_seqs if mergeable else 1
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()  # round-robin order
        self.rows: list[Sequence] = []  # in the batch's row order
        self.batch = BatchCache(mergeable)
        self.totals = StepTotals()
        # Deferred decode records: make_job(tokens, first_block, keyer) -> a prefill-only Sequence.
        self.make_job = make_job if getattr(runner, "defers_decode_records", False) else None
        self.jobs: deque[Sequence] = deque()
        self.job: Sequence | None = None  # the job prefilling now
        self.last_busy = 0.0  # (monotonic) when a request was last in the engine
        # deliver(events): hands the first tokens sampled from prefill to their clients
        # before the step's decode (one decode step of TTFT: ~150-300 ms on a real model)
        self.deliver = deliver

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.rows)

    @property
    def has_work(self) -> bool:
        return self.busy or (bool(self.jobs or self.job) and self.jobs_due_in() == 0)

    def jobs_due_in(self) -> float | None:
        """Seconds until queued record jobs may run (0: now; None: no job waits)."""
        if not (self.jobs or self.job) or self.busy:
            return None
        return max(0.0, self.last_busy + JOB_IDLE_S - time.monotonic())

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.last_busy = time.monotonic()

    def clear(self) -> None:
        """Forget every sequence (after a failed step)."""
        self.waiting.clear()
        self.prefilling.clear()
        self.rows = []
        self.batch = BatchCache(self.batch.mergeable)
        self.jobs.clear()
        self.job = None

    def cancel(self, seq: Sequence) -> GenerationEvent | None:
        """Drop `seq` wherever it is, leaving the other rows as they are; None if done."""
        if seq.finish_reason is not None:
            return None
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        elif seq in self.rows:
            i = self.rows.index(seq)
            self.batch.remove([i])
            del self.rows[i]
        return seq.finish("cancelled")

    def step(self) -> StepReport:
        report, totals = StepReport(), self.totals
        if self.busy:
            self.last_busy = time.monotonic()
        t = time.perf_counter()
        self._record_job(report)
        t0 = time.perf_counter()
        totals.record_jobs_s += t0 - t
        self._admit()
        self._prefill(report)
        t1 = time.perf_counter()
        if self.deliver is not None and self.rows and report.events:
            self.deliver(report.events)
            report.delivered = len(report.events)
        if self.rows:
            self._decode(report)
            totals.decode_steps += 1
            totals.decoded_tokens += report.decoded
            totals.decode_s += time.perf_counter() - t1
        totals.steps += 1
        totals.prefill_tokens += report.prefill_tokens
        totals.prefill_s += t1 - t0
        totals.recomputed_tokens += report.recomputed
        return report

    # -- the phases ---------------------------------------------------------------------------
    def _admit(self) -> None:
        held = []
        while self.waiting and len(self.prefilling) + len(self.rows) < self.max_seqs:
            seq = self.waiting.popleft()
            if self._awaits_shared_prefill(seq):
                held.append(seq)
                continue
            self.runner.prepare(seq)
            seq.timings.computed_tokens = seq.prompt_len - seq.pos
            self.prefilling.append(seq)
        self.waiting.extendleft(reversed(held))

    def _awaits_shared_prefill(self, seq: Sequence) -> bool:
        """Whether a prefilling sequence (or record job) has yet to record blocks this one
        starts with, or a turn end past them (forks of one prompt: tree of thought)."""
        fast = seq.reuse == "fast"
        if not (seq.keys or seq.turn_ends or fast):
            return False
        # (a fast request never waits on a record job: jobs run for exact requests or idle)
        for p in [*self.prefilling, *([self.job] if self.job and not fast else [])]:
            if not _same_namespace(seq, p):
                continue  # its records are never restored for seq: never wait on them
            if fast and p.reuse == "fast" and not p.is_record_job:
                # p's prompt cache, once prefilled, serves seq (live.py): worth waiting for
                # when p has little left beyond what they share (branches of one prompt);
                # otherwise wait only for the records, as an exact request does.
                ahead = shared_prefix(seq.tokens[:-1], p.tokens)
                if ahead >= _LIVE_WAIT_MIN and p.prompt_len - p.pos <= ahead + _LIVE_WAIT_MIN:
                    return True
            shared = shared_prefix(seq.keys, p.keys)
            if shared and p.pos < shared * self.block_size:
                return True
            # turn ends of seq past p's position, in or right after the blocks they share
            ahead = [e for e in seq.turn_ends if e > p.pos and e // self.block_size <= shared]
            if ahead and any(e <= shared_prefix(seq.tokens[:ahead[-1]], p.tokens)
                             for e in ahead):
                return True
        return False

    def _prefill(self, report: StepReport) -> None:
        spent = 0
        while self.prefilling:
            seq = self.prefilling[0]
            if not seq.is_prefilling:  # restored whole, with its last logits (a turn end)
                self.prefilling.popleft()
                logits, seq.last_logits = seq.last_logits, None
                assert logits is not None, "a sequence restored whole needs its last logits"
                seq.report_progress()
                self._start_decoding(seq, logits, report)
                continue
            n = seq.next_chunk(self.block_size)
            if spent and spent + n > self.max_prefill_tokens:
                break
            logits = seq.prefill_chunk(seq.model or self.runner.engine.lm.model, self.block_size)
            spent += n
            report.prefilled[seq.id] = report.prefilled.get(seq.id, 0) + n
            self.prefilling.popleft()
            if seq.is_prefilling:
                self.prefilling.append(seq)
            else:
                self._start_decoding(seq, logits, report)

    # -- deferred decode records ---------------------------------------------------------------
    def _record_job(self, report: StepReport) -> None:
        """One chunk of a record job, when the engine has nothing else to do or a waiting
        request starts with blocks the job records (a started job otherwise pauses)."""
        idle = not (self.waiting or self.prefilling or self.rows)
        while self.job is None and self.jobs:
            self.job = self.jobs.popleft() if idle else self._needed_job()
            if self.job is None:
                return
            if self.runner.recorded(self.job):
                self.job = None
            else:
                self.runner.prepare(self.job)  # restores what is recorded already
        job = self.job
        if job is None or not (idle or self._needed(job)):
            return
        if job.is_prefilling:
            n = job.next_chunk(self.block_size)
            job.prefill_chunk(job.model or self.runner.engine.lm.model, self.block_size)
            report.recomputed += n
        if not job.is_prefilling:
            job.cache, self.job = None, None

    def _needed(self, job: Sequence) -> bool:
        # (fast requests continue live caches rather than wait for records)
        return any(shared_prefix(seq.keys, job.keys) > job.first_block for seq in self.waiting
                   if seq.reuse != "fast")

    def _clone(self, cache: list) -> list:
        return clone(cache, self.runner.engine.lm.make_cache)

    def _needed_job(self) -> Sequence | None:
        """A queued job whose blocks some waiting request starts with."""
        job = next((j for j in self.jobs if self._needed(j)), None)
        if job is not None:
            self.jobs.remove(job)
        return job

    def drop_jobs(self, keys: frozenset) -> None:
        """Forget the record jobs that would write a checkpoint under any of `keys`
        (released)."""
        ck = self.runner.engine.checkpointer

        def writes(job):
            return ck.checkpoint_keys(job.tokens, job.keyer)

        for job in [j for j in self.jobs if not keys.isdisjoint(writes(j))]:
            self.jobs.remove(job)
        if self.job is not None and not keys.isdisjoint(writes(self.job)):
            self.job.cache, self.job = None, None

    def _defer(self, seq: Sequence) -> None:
        """Queue the record job of a finished row that crossed boundaries while decoding
        (`deferred_to` is only ever set when this scheduler makes jobs)."""
        if seq.deferred_to:
            self.jobs.append(self.make_job(seq.tokens[:seq.deferred_to],
                                           seq.prompt_len // self.block_size, seq.keyer))

    def _start_decoding(self, seq: Sequence, logits, report: StepReport) -> None:
        """Sample the first token from the prefill logits; join the batch unless done."""
        keep = getattr(self.runner, "keep_live", None)
        if keep is not None and seq.reuse == "fast" and not seq.is_record_job:
            # The prompt's cache, for later forks of it (its sliding-window rings still hold
            # the last chunk: more room to cut back than after decoding). The batch merges
            # copies of it, so only an unmerged row (used in place) needs its own.
            cache = seq.cache if self.batch.mergeable else self._clone(seq.cache)
            keep(seq, cache, seq.prompt_len)
        if seq.params.max_tokens == 0:
            report.events.append((seq, seq.finish("length")))
            return
        token, logprobs = seq.sampler(logits, seq.tokens)
        tok = int(token.item())
        event = seq.accept(tok, float(logprobs[tok].item()),
                           _top(logprobs, seq.params.top_logprobs))
        report.events.append((seq, event))
        if event.finish_reason is None:
            self.batch.add(seq.cache)
            seq.cache = None
            self.rows.append(seq)

    def _decode(self, report: StepReport) -> None:
        import mlx.core as mx

        rows, B = self.rows, self.block_size
        inputs = mx.array([[seq.tokens[-1]] for seq in rows])
        logits = self.runner.decode(rows, inputs, self.batch.caches)
        sampled = [seq.sampler(logits[i, -1], seq.tokens) for i, seq in enumerate(rows)]
        tokens = mx.stack([t for t, _ in sampled])
        picked = mx.stack([lp[t] for t, lp in sampled])
        mx.eval(tokens, picked, self.batch.state())
        tokens, picked = tokens.tolist(), picked.tolist()
        tops = [_top(lp, seq.params.top_logprobs) for (_, lp), seq in zip(sampled, rows)]
        report.decoded = len(rows)

        # Every row now holds all its tokens; record (and recompute) those on a boundary before
        # the batch changes shape.
        swapped: dict[int, list] = {}
        for i, seq in enumerate(rows):
            seq.pos = len(seq.tokens)
            if seq.hook is not None and seq.pos % B == 0:
                if self.make_job is not None:
                    seq.deferred_to = seq.pos
                    continue
                row = self.batch.extract(i)
                if seq.hook(seq.pos, seq.tokens, row, True):
                    swapped[i] = row
                    report.recomputed += B

        done = []
        keep = getattr(self.runner, "keep_live", None)
        for i, seq in enumerate(rows):
            event = seq.accept(tokens[i], picked[i], tops[i])
            report.events.append((seq, event))
            if event.finish_reason is not None:
                done.append(i)
                self._defer(seq)
                if keep is not None and seq.reuse == "fast" and i not in swapped:
                    # Everything the row was fed (the last sampled token never was).
                    keep(seq, self.batch.extract(i), seq.pos)
        self._reshape(done, swapped)

    def _reshape(self, done: list[int], swapped: dict[int, list]) -> None:
        """Drop finished rows; move recomputed rows to the end with their canonical state."""
        if not self.batch.mergeable:
            if done:
                self.batch.remove([0])
                self.rows = []
            return  # the one row's cache list was recomputed in place
        moved = [i for i in swapped if i not in done]
        gone = set(done) | set(moved)
        if gone:
            self.batch.remove(sorted(gone))
        for i in moved:
            self.batch.add(swapped[i])
        self.rows = [s for i, s in enumerate(self.rows) if i not in gone] + [
            self.rows[i] for i in moved]


def _same_namespace(a: Sequence, b: Sequence) -> bool:
    ka, kb = a.keyer, b.keyer
    return ka is kb or (ka is not None and kb is not None and ka.tag == kb.tag)



def _top(logprobs, k: int) -> dict | None:
    return top_logprobs(logprobs, k) if k else None
