"""One decode step of the batch's rows: built, maybe queued ahead (ahead.py), or verified.

Every decoding row takes one token a step, in one batched graph; text rows may have their
next step built and queued before this one's tokens are read back (ahead.py), and a lone row
with a draft (drafts.py) verifies it instead, in one chunk (speculate.py). A row whose drafter
is quiet (cooling down, or finding nothing) runs ahead too; if it drafts after all, the queued
step is taken back out of the caches first, so the verify sees what lockstep would. After the
tokens are read back, rows that decoded onto a block boundary are recorded by the prefix
cache, finished rows are committed and dropped, and recomputed rows move to the batch's end.
A mixin of Scheduler (scheduler.py), which owns admission and prefill and the state this
reads: `rows`, `batch`, `block_size`, `runner`, `prefix`, `totals`, `waiting`, `prefilling`,
`runs_ahead`, `_ahead` and `_arrived()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import GenerationEvent
from .ahead import Step, can_take_back, take_back
from .sampling import draw_rows, top_logprobs
from .sequence import Sequence

__all__ = ["DecodeSteps", "StepReport", "top"]


@dataclass(slots=True)
class StepReport:
    """What one step did: tokens prefilled per sequence id, rows decoded, events produced."""

    prefilled: dict[int, int] = field(default_factory=dict)
    recomputed: int = 0  # decoded tokens recomputed as chunks to record them
    decoded: int = 0  # tokens decoded: one per row, or what a verify step kept
    events: list[tuple[Sequence, GenerationEvent]] = field(default_factory=list)
    delivered: int = 0  # events already handed to `Scheduler.deliver` during the step
    # a lone row's decode verified a draft, or its drafter kept the step from running ahead
    speculated: bool = False

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefilled.values())


class DecodeSteps:
    """The decode step of Scheduler (see the module's docstring for the state it reads)."""

    def _decode(self, report: StepReport) -> None:
        import mlx.core as mx

        rows, B = self.rows, self.block_size
        step, self._ahead = self._ahead, None
        drafter = rows[0].drafter if len(rows) == 1 else None
        if drafter is not None:
            draft = self._draft(rows[0])
            if draft:
                if step is not None:  # the drafter woke while this step ran ahead: undo it
                    step = None
                    take_back(self.batch.caches)
                    self.totals.taken_back += 1
                self._speculate(report, draft)
                report.speculated = True
                return
            # a drafter that may draft next step keeps this one from running ahead: a cost of
            # speculating (pace.py)
            report.speculated = not drafter.quiet
        if step is None:
            step = self._build(rows, mx.array([[seq.tokens[-1]] for seq in rows]))
        else:  # its draws were built without taking their keys: take them now
            for seq in rows:
                seq.sampler.advance(1)
        if self._runs_ahead(rows):
            mx.async_eval(step.tokens, step.picked, self.batch.state())
            ids = step.tokens if step.tokens.dtype == mx.int32 else step.tokens.astype(mx.int32)
            self._ahead = self._build(rows, ids[:, None], ahead=True)
            mx.async_eval(self._ahead.tokens, self._ahead.picked, self.batch.state())
        else:
            mx.eval(step.tokens, step.picked, self.batch.state())
        tokens, picked = step.tokens.tolist(), step.picked.tolist()
        tops = [top(lp, seq.params.top_logprobs) for lp, seq in zip(step.logprobs, rows)]
        report.decoded = len(rows)

        # Every row now holds all its tokens; record (and recompute) those on a boundary before
        # the batch changes shape.
        swapped: dict[int, list] = {}
        for i, seq in enumerate(rows):
            seq.pos = len(seq.tokens)
            row = self.prefix.decoded(seq, lambda i=i: self.batch.extract(i))
            if row is not None:
                swapped[i] = row
                report.recomputed += B

        done = []
        for i, seq in enumerate(rows):
            event = seq.accept(tokens[i], picked[i], tops[i])
            report.events.append((seq, event))
            if event.finish_reason is not None:
                self._drop_ahead()  # the row was fed the token it ends on
                done.append(i)
                # everything the row was fed (the last sampled token never was)
                self.prefix.commit(seq, lambda i=i: swapped.get(i) or self.batch.extract(i))
        self._reshape(done, swapped)

    def _build(self, rows: list[Sequence], inputs, ahead: bool = False) -> Step:
        """The graph of one decode step of `rows` on `inputs` ([rows, 1] ids), unevaluated.
        `ahead`: a step queued ahead, whose draws take their sampler keys only when it is
        used (`advance`), so that a step taken back leaves the samplers as they were."""
        logits = self.runner.decode(rows, inputs, self.batch.caches)
        at = 0 if ahead else None
        return Step(*draw_rows(logits[:, -1], [(seq.sampler, seq.tokens, at) for seq in rows]))

    def _drop_ahead(self) -> None:
        """Forget the step queued ahead, if any, and take it back out of the caches: every
        row's token (the rows left decode that step again)."""
        if self._ahead is not None:
            self._ahead = None
            take_back(self.batch.caches)
            self.totals.taken_back += 1

    def _runs_ahead(self, rows: list[Sequence]) -> bool:
        """Whether the next decode step may be built and queued before this one's tokens are
        read back (ahead.py), this step's graph being built: text rows (one on its own caches,
        or a batch on mlx-lm's), nobody waiting, and a next step sure to run unless a row stops
        on this token (no row at a block boundary for the prefix cache to record at, none at
        the last token allowed), whose tokens the caches can take back then. A lone row with a
        drafter runs ahead while the drafter is quiet (cooling down, or finding nothing to
        draft): if it drafts after all, the next step takes the queued one back and
        verifies."""
        if (not self.runs_ahead or not rows or not self.batch.mergeable
                or not (self.batch.is_plain or len(rows) > 1)
                or not getattr(self.runner, "runs_ahead", False)
                or self.waiting or self.prefilling or self._arrived()):
            return False
        if len(rows) == 1 and rows[0].drafter is not None and not rows[0].drafter.quiet:
            return False  # (rows in a batch do not draft)
        return all(not seq.sampler.reads_tokens
                   and seq.timings.generated_tokens + 1 < seq.params.max_tokens
                   and len(seq.tokens) % self.block_size != 0
                   for seq in rows) and can_take_back(self.batch.caches)

    def _draft(self, seq: Sequence) -> list[int]:
        """The lone row's draft for this step ([] for none): never past the next block
        boundary (the prefix cache records the row there) nor past what the request may still
        generate."""
        held = len(seq.tokens) - 1  # tokens the cache holds: all but the last sampled one
        room = min(self.block_size - held % self.block_size,
                   seq.params.max_tokens - seq.timings.generated_tokens)
        return seq.drafter.draft(room - 1)

    def _speculate(self, report: StepReport, draft: list[int]) -> None:
        """One verify step for the batch's one row: its last token and `draft` in one chunk,
        the draws at each position, the draft kept while they agree (speculate.py)."""
        import mlx.core as mx

        from .speculate import rollback, snapshot

        seq, B = self.rows[0], self.block_size
        held = len(seq.tokens) - 1
        k, caches = len(draft), self.batch.caches
        saved = snapshot(caches)
        logits = self.runner.verify(seq, [seq.tokens[-1], *draft], caches, held)
        # what the draws look back on: the penalty window, not the whole path (no matcher
        # here: a row with one cannot verify)
        base = max(0, held + 1 - seq.params.penalty_context)
        seen = seq.tokens[base:] + draft
        tokens, picked, full = draw_rows(
            logits[0], [(seq.sampler, seen[:held + 1 + i - base], i) for i in range(k + 1)])
        mx.eval(tokens, picked, self.batch.state())
        tokens, picked = tokens.tolist(), picked.tolist()
        agree = 0
        while agree < k and tokens[agree] == draft[agree]:
            agree += 1
        seq.drafter.feedback(k, agree)
        t = seq.timings
        t.drafted_tokens += k
        t.accepted_tokens += agree
        self.totals.drafted_tokens += k
        self.totals.accepted_tokens += agree

        events = []
        for i in range(agree + 1):  # the agreed drafts, then the first draw that differs
            event = seq.accept(tokens[i], picked[i], top(full[i], seq.params.top_logprobs))
            events.append(event)
            if event.finish_reason is not None:
                break
        used = len(events)
        seq.sampler.advance(used)
        if not rollback(caches, k + 1 - used, k + 1, saved):  # put back: feed the kept again
            self.runner.verify(seq, seen[held - base:held - base + used], caches, held)
            mx.eval(self.batch.state())
        report.decoded = used
        # the row holds all it was fed; at a block boundary the prefix cache records it
        seq.pos = held + used
        swapped: dict[int, list] = {}
        row = self.prefix.decoded(seq, lambda: self.batch.extract(0))
        if row is not None:
            swapped[0] = row
            report.recomputed += B
        report.events.extend((seq, e) for e in events)
        done = []
        if events[-1].finish_reason is not None:
            done.append(0)
            self.prefix.commit(seq, lambda: swapped.get(0) or self.batch.extract(0))
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


def top(logprobs, k: int) -> dict | None:
    return top_logprobs(logprobs, k) if k else None
