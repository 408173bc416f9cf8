"""Continuous batching: which sequences prefill, which decode, and what one step does.

A sequence waits until a slot is free (`max_seqs` caps prefilling + decoding sequences), is
restored from its checkpoints (the runner's `prepare`), prefills on its own cache in
block-aligned chunks, then joins the batch of decoding rows. Each `step()`:

1. admits waiting sequences into free slots (FIFO), except one that starts with blocks another
   sequence is prefilling right now: it waits until those blocks are recorded and then
   restores them, so forks and `n > 1` compute a shared prefix once;
2. prefills whole chunks, round-robin over the prefilling sequences, until the step has spent
   `max_prefill_tokens` (at least one chunk, so prefill always progresses); a chunk is never
   split, since other chunk edges would change the arithmetic and make records non-canonical;
3. runs one decode step for every row together, so a long prompt arriving never stalls the
   others for more than one step's prefill budget. (A decode-boundary recompute, below, runs
   in the step that reaches the boundary and is not charged to that budget: one block per
   row per `block_size` tokens decoded.)

Decode boundaries. A row whose cache reaches a block boundary in decode is copied out and its
recorder recomputes the last block as one chunk from the records of the boundary before (see
`recorder.py`), records it, and the recomputed state replaces the row in the batch. That keeps
every row exactly where a single-request run would be (the single-request engine swaps the
same canonical state into its live cache), so batched output follows single-request output and
a fork restored from any checkpoint continues as the original did. Knows nothing about threads,
handles, or what kind of model runs the rows (the runner does).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .batchcache import BatchCache
from .events import GenerationEvent
from .sampling import top_logprobs
from .sequence import Sequence


@dataclass(slots=True)
class StepReport:
    """What one step did: tokens prefilled per sequence id, rows decoded, events produced."""

    prefilled: dict[int, int] = field(default_factory=dict)
    recomputed: int = 0  # decode-boundary tokens recomputed as chunks
    decoded: int = 0  # rows that decoded one token
    events: list[tuple[Sequence, GenerationEvent]] = field(default_factory=list)

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
    decode_s: float = 0.0  # batched decode steps, boundary recomputes included
    recomputed_tokens: int = 0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class Scheduler:
    def __init__(self, runner, block_size: int, max_seqs: int, max_prefill_tokens: int,
                 mergeable: bool = True):
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

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.rows)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def clear(self) -> None:
        """Forget every sequence (after a failed step)."""
        self.waiting.clear()
        self.prefilling.clear()
        self.rows = []
        self.batch = BatchCache(self.batch.mergeable)

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
        t0 = time.perf_counter()
        self._admit()
        self._prefill(report)
        t1 = time.perf_counter()
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
        """Whether a prefilling sequence has yet to record blocks this one starts with."""
        for p in self.prefilling if seq.keys else ():
            shared = next((i for i, (a, b) in enumerate(zip(seq.keys, p.keys)) if a != b),
                          min(len(seq.keys), len(p.keys)))
            if shared and p.pos < shared * self.block_size:
                return True
        return False

    def _prefill(self, report: StepReport) -> None:
        spent = 0
        while self.prefilling:
            seq = self.prefilling[0]
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

    def _start_decoding(self, seq: Sequence, logits, report: StepReport) -> None:
        """Sample the first token from the prefill logits; join the batch unless done."""
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
                row = self.batch.extract(i)
                if seq.hook(seq.pos, seq.tokens, row, True):
                    swapped[i] = row
                    report.recomputed += B

        done = []
        for i, seq in enumerate(rows):
            event = seq.accept(tokens[i], picked[i], tops[i])
            report.events.append((seq, event))
            if event.finish_reason is not None:
                done.append(i)
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


def _top(logprobs, k: int) -> dict | None:
    return top_logprobs(logprobs, k) if k else None
