"""The n-gram index drafts are looked up in: where each 12-, 6- and 3-gram of some token
sequences ended.

A lookup takes the longest of those keys the end of a sequence has occurred as, extends each
earlier occurrence backwards to measure how long the match is, and returns the longest (most
recent on ties). The longer keys find the right place in a run that repeats one token or
phrase many times, where the last few occurrences of a trigram all sit at the run's end.

An index can be handed on to a request whose tokens start like those of the sequence it
indexed (`rebase`): the occurrences inside the shared prefix stay, those past it are taken
out again, and only the new tokens are hashed. Knows nothing about requests or namespaces
(drafts.py decides who may take an index over).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NgramIndex"]

NS = (12, 6, 3)  # lookup keys: the last n tokens, longest first
N = NS[-1]
PER_KEY = 4  # occurrences a lookup reads per key (the most recent live ones)
_MAX_MATCH = 32  # how far back a match is measured


class NgramIndex:
    """Token sequences indexed by n-gram: at which (sequence, end) each n-gram ended.

    `per_key` occurrences are stored per key (most recent), lookups read the last `PER_KEY`
    live ones: room above `PER_KEY` keeps the ones that occurrences taken out again
    (`rebase`, `forget`) had pushed off, so that a rebased index drafts as a fresh one would."""

    def __init__(self, per_key: int = PER_KEY):
        assert per_key >= PER_KEY
        self.per_key = per_key
        self.seqs: dict[int, list[int]] = {}
        # hash of an n-gram -> where it ended, (sequence id << 32 | end), one int or a list
        # of the most recent: ~1/3 of the bytes of tuples (a hash collision only costs a
        # lookup: the tokens are compared)
        self._where: dict[int, int | list[int]] = {}
        self._indexed: dict[int, int] = {}  # sequence id -> n-grams ending up to here indexed
        self._next_id = 0

    def add(self, tokens: Sequence[int]) -> int:
        """Index a sequence (kept by reference: `extend` it by appending and calling `grow`)."""
        sid = self._next_id
        self._next_id += 1
        self.seqs[sid] = tokens if isinstance(tokens, list) else list(tokens)
        self._indexed[sid] = 0
        self.grow(sid)
        return sid

    def grow(self, sid: int) -> None:
        """Index the tokens appended to sequence `sid` since the last call."""
        seq, start = self.seqs[sid], self._indexed[sid]
        where, per_key = self._where, self.per_key
        for end in range(max(start + 1, N), len(seq) + 1):
            at = sid << 32 | end
            for n in NS:
                if n > end:
                    continue
                key = hash(tuple(seq[end - n:end]))
                hits = where.get(key)
                if hits is None:
                    where[key] = at  # most keys occur once: an int, not a list
                elif isinstance(hits, int):
                    where[key] = [hits, at]
                else:
                    hits.append(at)
                    if len(hits) > per_key:
                        del hits[0]
        self._indexed[sid] = len(seq)

    def drop(self, sid: int) -> None:
        """Forget a sequence; its occurrences stay until `prune` (cheap, for many drops)."""
        self.seqs.pop(sid, None)
        self._indexed.pop(sid, None)

    def forget(self, sid: int) -> None:
        """Forget a sequence and take its occurrences out (work in its length, not the
        index's)."""
        self._unindex(sid, 0)
        self.drop(sid)

    def rebase(self, sid: int, tokens: list[int], shared: int) -> None:
        """Make `tokens` sequence `sid`, whose first `shared` tokens it holds already; every
        other sequence is forgotten. Call `grow` to index the rest."""
        for other in [s for s in self.seqs if s != sid]:
            self.forget(other)
        self._unindex(sid, shared)
        self.seqs[sid] = tokens
        self._indexed[sid] = min(self._indexed[sid], shared)

    def _unindex(self, sid: int, start: int) -> None:
        """Take out the occurrences of sequence `sid` that end past `start`."""
        seq, where = self.seqs[sid], self._where
        for end in range(max(start + 1, N), self._indexed[sid] + 1):
            at = sid << 32 | end
            for n in NS:
                if n > end:
                    continue
                key = hash(tuple(seq[end - n:end]))
                hits = where.get(key)
                if hits == at:
                    del where[key]
                elif isinstance(hits, list) and at in hits:  # (not there: pushed off)
                    hits.remove(at)
                    if len(hits) == 1:
                        where[key] = hits[0]
        self._indexed[sid] = min(self._indexed[sid], start)

    def prune(self) -> None:
        """Forget the occurrences of dropped sequences (bounded memory after evictions)."""
        live = self.seqs
        for key, hits in list(self._where.items()):
            kept = [h for h in ([hits] if isinstance(hits, int) else hits) if h >> 32 in live]
            if not kept:
                del self._where[key]
            else:
                self._where[key] = kept[0] if len(kept) == 1 else kept

    def best(self, tail: Sequence[int], skip: tuple[int, int] | None = None
             ) -> tuple[int, list[int], int] | None:
        """(match length, the sequence, where the continuation starts) for the longest earlier
        occurrence of the end of `tail`; `skip` = (sid, end) is the tail itself."""
        for key_len in NS:
            if len(tail) < key_len:
                continue
            best = None
            key = list(tail[-key_len:])
            hits = self._where.get(hash(tuple(key)), ())
            read = 0
            for at in reversed([hits] if isinstance(hits, int) else hits):
                # most recent first: it wins ties
                sid, end = at >> 32, at & 0xFFFFFFFF
                seq = self.seqs.get(sid)
                if seq is None:  # a dropped sequence's: not one of the PER_KEY read
                    continue
                read += 1
                if read > PER_KEY:
                    break
                if (sid, end) == skip or end >= len(seq) or seq[end - key_len:end] != key:
                    continue
                n = key_len
                limit = min(_MAX_MATCH, end, len(tail))
                while n < limit and seq[end - n - 1] == tail[-n - 1]:
                    n += 1
                if best is None or n > best[0]:
                    best = (n, seq, end)
            if best is not None:
                return best
        return None

