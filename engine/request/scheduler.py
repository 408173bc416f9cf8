"""Continuous batching: which sequences prefill, which decode, and what one step does.

A sequence waits until a slot is free (`max_seqs` caps prefilling + decoding sequences), is
given its cache by the prefix cache (`match`: restored from records or continued from a live
cache), prefills on it in chunks, then joins the batch of decoding rows. Each `step()`:

1. runs one chunk of a record job (prefix_cache.py) if the engine has nothing else to do (the
   engine steps by itself for jobs alone once it has been quiet a moment) or a waiting
   request needs that job's blocks;
2. admits waiting sequences into free slots (FIFO), except one whose prefix another sequence
   is computing right now (the prefix cache's `waits`: forks and `n > 1` compute a shared
   prefix once); the RAM budget (cache/budget.py) may hold the queue until running
   sequences finish, after making room by shrinking the live pool and the RAM tier;
3. prefills whole chunks until the step has spent `max_prefill_tokens` (at least one chunk):
   first each sequence whose prompt ends within its next chunk (a short request, or a long
   one's last chunk), shortest first, so that a short request's first token does not wait
   behind another's long prompt; then round-robin over the rest (whose head goes first the
   next step if these left it no chunk: every prefill progresses), stopping early between
   chunks when a request `arrived` meanwhile. A chunk is never split, since other chunk
   edges would change the arithmetic and make records non-canonical (a sequence restored
   whole — its prompt ends at a recorded turn end, whose record holds the last logits — goes
   straight to decoding). Each first token goes to its client (`deliver`) once sampled;
4. runs one decode step for every row together, so a long prompt arriving never stalls the
   others for more than one step's prefill budget; a step that prefilled while a request
   arrived leaves its decode to the next (at most every other step), which admits and
   prefills that request first. Which step a row decodes in, and beside which rows, changes
   none of its tokens. Text rows queue their next step before reading this one's tokens
   back (ahead.py), so the Python on both sides of the kernels overlaps them; a waiting
   request has that step taken first, at the start of the next. The decode step
   itself (build, step ahead, verify, then records and finished rows) is decodestep.py's.

The prefix cache hears of each sequence when its prompt is prefilled and when it finishes
(`commit`), and of each row that decodes onto a block boundary (`decoded`: a vision row's
recomputed canonical state then replaces it in the batch). Knows nothing about threads,
handles, reuse, or what kind of model runs the rows (the runner does).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..events import GenerationEvent
from .ahead import Step, is_enabled
from .batchcache import BatchCache
from .buffers import StepBuffers
from .decodestep import DecodeSteps, StepReport, top
from .pace import Pace
from .sampling import draw_rows
from .sequence import Sequence

__all__ = ["Scheduler", "StepReport", "StepTotals"]


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
    drafted_tokens: int = 0  # draft tokens verified (speculate.py)
    accepted_tokens: int = 0  # of those, the ones the model drew itself
    # steps queued ahead and taken back (a wasted step each): a lone row's drafter drafted
    # after all, or a row of the batch stopped or was cancelled
    taken_back: int = 0
    record_jobs_s: float = 0.0  # deferred decode records (prefill-only jobs)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class Scheduler(DecodeSteps):
    def __init__(self, runner, prefix, block_size: int, max_seqs: int, max_prefill_tokens: int,
                 mergeable: bool = True, deliver=None, copy=None, budget=None):
        assert max_seqs >= 1 and max_prefill_tokens >= 1
        self.runner = runner
        self.prefix = prefix  # the prefix cache: match, commit, record jobs
        self.block_size = block_size
        self.max_seqs = max_seqs if mergeable else 1
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()  # round-robin order
        self.rows: list[Sequence] = []  # in the batch's row order
        self.batch = BatchCache(mergeable, copy)  # copy: a lone row decodes unmerged
        self.totals = StepTotals()
        self.last_busy = 0.0  # time.monotonic() of the last step with a request in it
        # arrived(): whether a request came in during the step (the engine thread's queue),
        # so that it is admitted before the step spends more time on others
        self.arrived: Callable[[], bool] | None = None
        self._yielded = False  # the last step left its decode to this one
        self._head_waited = False  # the last step's round gave its head no chunk
        # deliver(events): hands the first tokens sampled from prefill to their clients
        # before the step's decode (one decode step of TTFT: ~150-300 ms on a real model)
        self.deliver = deliver
        self.budget = budget  # the RAM budget: whether running caches leave room for another
        self.runs_ahead = is_enabled()  # whether decode steps may run ahead (ahead.py)
        self._ahead: Step | None = None  # the rows' next decode step, queued
        self.pace = Pace()  # what a lone row's step costs, plain and speculating (pace.py)
        self.buffers = StepBuffers()  # mlx's buffer cache sized for the step (buffers.py)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.rows)

    @property
    def has_work(self) -> bool:
        return self.busy or bool(self.prefix.jobs)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def clear(self) -> None:
        """Forget every sequence (after a failed step)."""
        self.waiting.clear()
        self.prefilling.clear()
        self.rows = []
        self._ahead = None
        self.batch = BatchCache(self.batch.mergeable, self.batch.copy)
        self.prefix.reset()
        self._reserve()

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
            self._drop_ahead()  # the queued step fed every row: take it back first
            self.batch.remove([i])
            del self.rows[i]
        return seq.finish("cancelled")

    def step(self) -> StepReport:
        report, totals = StepReport(), self.totals
        # A step queued ahead is taken first when a request waits: admitting it may change the
        # batch the step was built on.
        early = self._ahead is not None and bool(self.waiting or self.prefilling)
        if early:
            self._timed_decode(report, time.perf_counter())
        t = time.perf_counter()
        recomputed = self.prefix.work(self.waiting, idle=not self.busy)
        if recomputed:
            self.buffers.prefill()
        report.recomputed += recomputed
        t0 = time.perf_counter()
        totals.record_jobs_s += t0 - t
        self._admit()
        self._prefill(report)
        if report.prefilled or recomputed:  # not a decode step's cost: time none across it
            self.pace.forget()
        t1 = time.perf_counter()
        self._deliver_new(report)
        if self.rows and not early and not self._yields(report):
            self._timed_decode(report, t1)
        totals.steps += 1
        totals.prefill_tokens += report.prefill_tokens
        totals.prefill_s += t1 - t0
        totals.recomputed_tokens += report.recomputed
        self._reserve()  # (rows that finished give their room back)
        if report.prefilled or report.decoded or report.events or self.busy:
            self.last_busy = time.monotonic()
        return report

    def _timed_decode(self, report: StepReport, t1: float) -> None:
        totals = self.totals
        self.buffers.decode(len(self.rows))
        lone = self.rows[0] if len(self.rows) == 1 else None
        self._decode(report)
        now = time.perf_counter()
        totals.decode_steps += 1
        totals.decoded_tokens += report.decoded
        totals.decode_s += now - t1
        self.pace.step_done(lone, now, report.decoded, report.speculated,
                            clean=not report.recomputed)

    # -- the phases ---------------------------------------------------------------------------
    def _admit(self) -> None:
        held = []
        while self.waiting and len(self.prefilling) + len(self.rows) < self.max_seqs:
            seq = self.waiting.popleft()
            if self.prefix.waits(seq, self.prefilling):
                held.append(seq)
                continue
            if self.budget is not None and not self.budget.admits(
                    seq, self._running(), alone=not (self.prefilling or self.rows)):
                held.append(seq)  # it and those after it wait for running ones to finish
                break
            self.prefix.match(seq)
            self.prefilling.append(seq)
            self._reserve()  # room for it: the pool shrinks, then the RAM tier spills
        self.waiting.extendleft(reversed(held))

    def _running(self) -> list[Sequence]:
        """Every sequence holding a cache now: prefilling, decoding, a record job's."""
        job = self.prefix.jobs.current
        return [*self.prefilling, *self.rows, *([job.seq] if job is not None else [])]

    def _reserve(self) -> None:
        if self.budget is None:
            return
        if self.budget.footprint is None:  # read off the first caches that hold tokens
            for seq in self.prefilling:
                self.budget.learn(seq.cache)
            self.budget.learn(self.batch.caches, self.batch.num_rows)
        self.budget.reserve(self._running())

    def _prefill(self, report: StepReport) -> None:
        # Sequences whose prompt ends within their next chunk go first, shortest first: their
        # first token is one chunk away. Then round-robin, in the same budget; a round whose
        # head got no chunk for them goes first the next step (no prompt waits for ever).
        spent = 0 if self._head_waited else self._prefill_last(report)
        rounds = 0
        while self.prefilling:
            seq = self.prefilling[0]
            if not seq.is_prefilling:  # (restored whole, admitted with the others)
                self.prefilling.popleft()
                self._first_token(seq, report)
                continue
            n = seq.next_chunk(self.block_size)
            if (spent or rounds) and (spent + n > self.max_prefill_tokens or self._arrived()):
                break
            spent += n
            rounds += 1
            self._prefill_chunk(report)
        self._head_waited = bool(self.prefilling) and not rounds

    def _prefill_last(self, report: StepReport) -> int:
        """Prefill the sequences whose prompt ends within their next chunk, shortest first,
        within the step's budget (at least one); the tokens spent."""
        last = sorted((self._left(s), i, s) for i, s in enumerate(self.prefilling)
                      if self._left(s) == (s.next_chunk(self.block_size)
                                           if s.is_prefilling else 0))
        spent = 0
        for n, _, seq in last:
            if spent and spent + n > self.max_prefill_tokens:
                break
            spent += n
            self.prefilling.remove(seq)
            if n:
                self.prefilling.appendleft(seq)
                self._prefill_chunk(report)
            else:
                self._first_token(seq, report)
        return spent

    @staticmethod
    def _left(seq: Sequence) -> int:
        return seq.prompt_len - seq.pos

    def _prefill_chunk(self, report: StepReport) -> None:
        """One chunk of the first prefilling sequence; it goes to the back of the round, or
        starts decoding."""
        seq = self.prefilling.popleft()
        n = seq.next_chunk(self.block_size)
        self.buffers.prefill()
        logits = seq.prefill_chunk(seq.model, self.block_size)
        report.prefilled[seq.id] = report.prefilled.get(seq.id, 0) + n
        if seq.is_prefilling:
            self.prefilling.append(seq)
        else:
            self._start_decoding(seq, logits, report)
            self._deliver_new(report)

    def _first_token(self, seq: Sequence, report: StepReport) -> None:
        """A sequence restored whole, with its last logits (a turn end): straight to its
        first token."""
        logits, seq.last_logits = seq.last_logits, None
        assert logits is not None, "a sequence restored whole needs its last logits"
        seq.report_progress()
        self._start_decoding(seq, logits, report)
        self._deliver_new(report)

    def _deliver_new(self, report: StepReport) -> None:
        if self.deliver is not None and len(report.events) > report.delivered:
            self.deliver(report.events[report.delivered:])
            report.delivered = len(report.events)

    def _arrived(self) -> bool:
        return self.arrived is not None and self.arrived()

    def _yields(self, report: StepReport) -> bool:
        """Whether this step, which prefilled or started a sequence, leaves its decode to the
        next, for a request that arrived during it (never two steps running)."""
        started = bool(report.prefilled or report.events)
        self._yielded = not self._yielded and started and self._arrived()
        return self._yielded

    def _start_decoding(self, seq: Sequence, logits, report: StepReport) -> None:
        """Sample the first token from the prefill logits; join the batch unless done."""
        # The prompt's cache, for later forks of it (its sliding-window rings still hold the
        # last chunk: more room to cut back than after decoding).
        self.prefix.commit(seq, lambda: seq.cache)
        if seq.params.max_tokens == 0:
            report.events.append((seq, seq.finish("length")))
            return
        token, picked, (logprobs,) = draw_rows(logits.reshape(1, -1),
                                               [(seq.sampler, seq.tokens, None)])
        event = seq.accept(int(token[0].item()), float(picked[0].item()),
                           top(logprobs, seq.params.top_logprobs))
        report.events.append((seq, event))
        if event.finish_reason is None:
            self.batch.add(seq.cache)
            seq.cache = None
            self.rows.append(seq)
