"""Decoding a step ahead: step t+1's graph built and queued before step t's token is read back.

A decode step is Python building the model's graph (~2 ms a token on SmolLM2), the kernels
running it, then Python again (reading the token back, stop rules, detokenising, streaming).
As mlx-lm's `generate_step` does, the scheduler may build step t+1 on step t's sampled token
while it is still an unevaluated array and queue it (`mx.async_eval`) before waiting for step
t, so both Pythons overlap the kernels. The arithmetic is the same, so every token and logprob
is too; what changes is that the cache holds the step-ahead token before the scheduler knows
whether the row goes on. So a step runs ahead only where that token can be taken back exactly
(`can_take_back`: global caches trim, a sliding window's ring before it wraps) and the draw
does not read the token values it has not seen yet (penalties, constraints); a row that
finishes takes it back (`take_back`) before its cache is committed, and so does a row whose
drafter, quiet when the step was queued, drafts after all (it verifies instead). A batch of
rows runs ahead as one: when any row finishes, or one is cancelled, the whole queued step is
taken back (every row's token) and the rows left decode it again in lockstep. The queued
draws take their sampler keys only when the step is used. The scheduler decides when (text
rows, a lone row's drafter quiet if it has one, no row at a block boundary or its last token
next). Knows
nothing about rows, stop rules or records. `FORKV_DECODE_AHEAD=off` keeps every step in
lockstep (comparisons).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .cacheshape import leaves, rotates, trims

__all__ = ["Step", "can_take_back", "is_enabled", "take_back"]


def is_enabled() -> bool:
    """Whether steps may run ahead (FORKV_DECODE_AHEAD, on unless "off")."""
    return os.environ.get("FORKV_DECODE_AHEAD", "").strip().lower() not in ("off", "0", "false",
                                                                          "no")


@dataclass(slots=True)
class Step:
    """One decode step's draws, queued and maybe not evaluated yet."""

    tokens: object  # mx.array [rows]: the sampled ids
    picked: object  # mx.array [rows]: their logprobs
    logprobs: list  # each row's whole logprobs where it reports top logprobs, else None


def can_take_back(caches) -> bool:
    """Whether one more one-token update of `caches` (every layer's, one row's or a batch's)
    could be taken back exactly: every leaf trims, or is a ring (without `keep`) that one more
    token does not wrap (mlx-lm's `is_trimmable`: a batch ring counts the tokens written to
    its padded rows)."""
    for c in leaves(caches):
        if trims(c):
            continue
        if not (rotates(c) and c.is_trimmable()):
            return False
    return True


def take_back(caches) -> None:
    """Undo the last one-token update of `caches` (checked with `can_take_back` before it):
    the next update writes where it wrote, and the state reads what it read before."""
    for c in leaves(caches):
        n = c.trim(1)
        assert n == 1, "a step ahead was taken back from an empty cache"
