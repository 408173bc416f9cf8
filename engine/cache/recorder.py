"""The boundary hook of one running sequence: snapshot every block it completes.

Prefill chunks end on block boundaries, so prefill snapshots are exactly what a fresh
block-aligned prefill produces. Decode is not: one-token steps round differently from a chunk,
so a state reached by decoding would restore to slightly different logits. Text rows leave
decoded blocks to a record job after the request (a prefill through this same recorder; see
scheduler.py). For rows that cannot defer (vision), at a decode boundary n the recorder
recomputes the block [n-B, n) as one chunk from the records of boundary n-B, records that,
and swaps it into the live cache — one block of prefill per block decoded, and every
checkpoint (and all decoding after it) matches a fresh prefill bit for bit. Caches whose kind
`trims_exactly` (global K/V) just drop the decoded block instead.
If the records of n-B are gone, the boundary is simply not recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import kinds as _kinds
from .layout import get_leaf, set_leaf
from .records import Record, rebuild, record_tokens, snapshot


class SequenceRecorder:
    def __init__(self, checkpointer, keys: list[bytes], extras: dict | None = None,
                 keyer=None):
        self.ck = checkpointer
        self.keyer = keyer or checkpointer.keyer  # the run's namespace: keys and record tags
        self.keys = list(keys)
        self.extras = extras
        # The kinds a decode boundary rebuilds from records (the rest are trimmed in place).
        self.rebuilt = frozenset(k for k in checkpointer.layout.kinds
                                 if k in checkpointer.kinds and not _kinds.named(k).trims_exactly)
        # The records the next decode boundary recomputes from (rebuilt kinds of the newest
        # blocks), so a decoding sequence need not read them back from disk.
        self.recent: dict[tuple[int, str], Record] = {}
        # What recomputes a decoded block; a vision sequence puts its own forward here.
        self.model = checkpointer.lm.model

    def __call__(self, pos: int, tokens: Sequence[int], cache: list, in_decode: bool) -> bool:
        """Record boundary `pos`; True when `cache` was recomputed (decode boundaries only), so a
        caller holding the sequence's state elsewhere (a batch row) knows to take it from here."""
        ck = self.ck
        B = ck.block_size
        block = pos // B - 1
        if block >= len(self.keys):  # decode went past the prompt's blocks: extend the chain
            self.keys.extend(self.keyer.keys(tokens[:pos], self.extras, start=len(self.keys),
                                             prev=self.keys[-1] if self.keys else None))
        if in_decode and not self._recompute_block(pos, tokens, cache):
            return False
        key = self.keys[block]
        kinds = {k for k in ck.kinds if not ck.store.contains(key, k)}
        for record in snapshot(cache, ck.layout, pos, B, tokens, kinds, self.keyer.tag):
            ck.store.put(key, record)
            if record.kind in self.rebuilt:
                self.recent[(record.block, record.kind)] = record
        if kinds:
            ck.stats.blocks_recorded += 1
        # Boundary pos + B rebuilds from the records a restore at pos reads.
        reach = [ck.layout.blocks(k, pos, B).start for k in self.rebuilt]
        self._forget_before(min(reach, default=block))
        return in_decode

    def _recompute_block(self, pos: int, tokens: Sequence[int], cache: list) -> bool:
        """Make `cache` hold exactly what a fresh block-aligned prefill holds at `pos`."""
        import mlx.core as mx

        ck, B = self.ck, self.ck.block_size
        start = pos - B
        records: dict[str, dict[int, Record]] = {}
        for kind in self.rebuilt if start > 0 else ():
            got = records[kind] = {}
            for b in ck.layout.blocks(kind, start, B):
                got[b] = self._record(b, kind, record_tokens(kind, tokens, (b + 1) * B, B))
                if got[b] is None:
                    return False
        base = rebuild(ck.lm.make_cache(), ck.layout, start, B, records, kinds=self.rebuilt)
        for leaf in ck.layout.layers:
            if leaf.kind in self.rebuilt:
                set_leaf(cache, leaf.path, get_leaf(base, leaf.path))
            else:
                # K/V before `start` are already canonical; drop the decoded block's.
                get_leaf(cache, leaf.path).trim(B)
        model = self.model
        if model is ck.lm.model and ck.turns is not None:
            # cut at turn ends as a fresh prefill does
            model = ck.model_for(tokens[:pos], keyer=self.keyer)
        model(mx.array(tokens[start:pos])[None], cache=cache)
        mx.eval([c.state for c in cache])
        return True

    def _record(self, block: int, kind: str, expect: bytes) -> Record | None:
        record = self.recent.get((block, kind))
        if record is None:
            record = self.ck.store.get(self.keys[block], kind)
        if record is None or record.tokens != expect or record.namespace != self.keyer.tag:
            return None
        return record

    def _forget_before(self, block: int) -> None:
        for slot in [s for s in self.recent if s[0] < block]:
            del self.recent[slot]
