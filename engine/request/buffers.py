"""mlx's CPU buffer cache, sized by step kind, so that a decode step's temporaries are reused.

mlx's CPU allocator keeps freed buffers for reuse up to a cache limit (32 MiB by default),
hands one back only for a request of its size (within two pages), and never evicts one to make
room: once the cache is full, every other freed buffer goes back to malloc. The `forkv`
process has malloc map blocks of 1 MiB and up and unmap them when freed (forkv/arenas.py, for
long prompts' RSS), so a decode step whose logits, log-probabilities and draws do not fit in
what the cache has left maps them afresh and faults their pages in, every step: Gemma 3 270M
(262K-word vocabulary) at 8 rows in `forkv serve` took ~1,000 page faults a token and 68.6
instead of 52.4 ms a step; one row, ~800 faults a token once the cache held an 8-row step's
buffers.

`StepBuffers` gives decode steps a cache sized to hold a step's buffers: emptied when the
number of rows changes (the last shape's buffers fit no request of the new one) and allowed
`DECODE_LIMIT` for the new shape's first steps; from the third step it is cut to what the step
left cached (measured) and half as much again plus `SLACK`, so that buffers nobody asks for again
(a cache's old K/V after it grew, a record's copies) are unmapped rather than held. A step that
computes prompt tokens (a prefill chunk, a record job) puts mlx's default back, so a long
prompt's chunk buffers, whose sizes grow with the context, are unmapped as before. Only where
`arenas.limit()` fixed the threshold (the `forkv` process): elsewhere malloc's own heap
reuses those buffers, and a program's mlx settings are its own. The cache is the process's;
several engines in one server each set it for the step they run, which is only ever a
question of speed.
"""

from __future__ import annotations

from forkv import arenas

__all__ = ["DECODE_LIMIT", "PREFILL_LIMIT", "SLACK", "StepBuffers"]

DECODE_LIMIT = 128 << 20  # a new shape's first steps (8 Gemma 3 rows leave 40-75 MiB cached)
PREFILL_LIMIT = 32 << 20  # mlx's default, and the least a decode step gets
SLACK = 16 << 20
WARM_STEPS = 2  # steps at a shape before what they leave cached is measured


class StepBuffers:
    """Sets mlx's buffer cache for the step the scheduler runs next (engine thread)."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = arenas.threshold_fixed() if enabled is None else enabled
        self._rows: int | None = None  # decode rows the cache holds buffers for; None: prefill
        self._steps = 0  # decode steps at this row count

    def prefill(self) -> None:
        if self.enabled and self._rows is not None:
            import mlx.core as mx

            mx.set_cache_limit(PREFILL_LIMIT)  # (frees what is cached past it)
            self._rows = None

    def decode(self, rows: int) -> None:
        if not self.enabled:
            return
        import mlx.core as mx

        if rows != self._rows:
            mx.clear_cache()
            mx.set_cache_limit(DECODE_LIMIT)
            self._rows, self._steps = rows, 0
            return
        self._steps += 1
        if self._steps == WARM_STEPS:  # the last step's buffers, back in the cache
            held = mx.get_cache_memory()
            mx.set_cache_limit(max(PREFILL_LIMIT, held + held // 2 + SLACK))
