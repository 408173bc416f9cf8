"""What a lone row's decode costs a token, plain and while it speculates, on this machine now.

Speculation pays where a verify step's accepted drafts outweigh what speculating costs: the
verify chunk itself, the step queued ahead that a draft takes back, and the steps after it that
cannot run ahead while the drafter looks for more. Those costs differ by machine, model and
context, so they are measured rather than modelled: each lone row's decode step is timed from
the end of the step before it (the interval covers everything the step cost, the queued work
it waited on included), and the interval goes to the plain pace (an engine-wide moving
average of seconds per token) or to the row's drafter (drafts.py's `spent`), which compares
the two and stops drafting a while where speculating is slower. Timing decides only when to
speculate, never what a row decodes: verified tokens are the bits of one-token decode.
"""

from __future__ import annotations

__all__ = ["Pace"]

_WEIGHT = 0.1  # the newest plain step's weight in the moving average


class Pace:
    """The plain pace and the bookkeeping that sorts each lone row's step into it."""

    def __init__(self):
        self.plain_s: float | None = None  # seconds per token of a plain lone-row step
        self._mark: tuple[object, float] | None = None  # (row, when its last step ended)
        self._speculated = False  # the last step verified, or was held back by its drafter

    def step_done(self, seq, now: float, tokens: int, speculated: bool, clean: bool) -> None:
        """A decode step of lone row `seq` (None: of a batch) ended at `now` with `tokens`
        kept; `speculated`: it verified a draft or its drafter held it from running ahead;
        `clean`: nothing else (prefill, a boundary record) shared its interval."""
        mark, self._mark = self._mark, (None if seq is None else (seq, now))
        # the step after a speculating one pays for it too: it could not be queued ahead
        counted, self._speculated = speculated or self._speculated, speculated
        if seq is None or mark is None or mark[0] is not seq or not clean or tokens < 1:
            return
        seconds = now - mark[1]
        if counted:
            if seq.drafter is not None:
                seq.drafter.spent(seconds, tokens, self.plain_s)
        elif self.plain_s is None:
            self.plain_s = seconds / tokens
        else:
            self.plain_s += _WEIGHT * (seconds / tokens - self.plain_s)

    def forget(self) -> None:
        """The next step starts no interval (the batch changed under it)."""
        self._mark, self._speculated = None, False
