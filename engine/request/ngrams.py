"""The n-gram indexes drafts are looked up in: where each 12-, 6- and 3-gram of some token
sequences ended.

A lookup takes the longest of those keys the end of a sequence has occurred as, reads its
`PER_KEY` most recent occurrences in sequences still held, extends each backwards to measure
how long the match is, and returns the longest (most recent on ties). The longer keys find the
right place in a run that repeats one token or phrase many times, where the last few
occurrences of a trigram all sit at the run's end.

Two indexes answer the same lookups, with the same key (Python's hash of the n-gram's tuple):
`NgramIndex` here, a dict grown a token at a time (a decoding request's own tokens), and
`NgramLog` (ngram_log.py), whole sequences hashed at once (`ngrams`, vectorised here) into a
few sorted numpy arrays, for what is kept. Knows nothing about requests or namespaces
(drafts.py decides who may take an index over).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

__all__ = ["NgramIndex", "best_match", "ngrams"]

NS = (12, 6, 3)  # lookup keys: the last n tokens, longest first
N = NS[-1]
PER_KEY = 4  # occurrences a lookup reads per key (the most recent live ones)
MAX_MATCH = 32  # how far back a match is measured
_END = 0xFFFFFFFF  # an occurrence is (sequence id << 32 | end)

Keys = list[tuple[list[int] | None, int]]  # (the last n tokens, their key), n in NS


def best_match(tail: Sequence[int], layers: Sequence, keys: Keys | None = None
               ) -> tuple[int, Sequence[int], int] | None:
    """(match length, the sequence, where the continuation starts) for the longest earlier
    occurrence of the end of `tail` in `layers` (indexes, the most recent first). `keys`: the
    tail's keys hashed so far, shared by lookups of one tail (filled as needed)."""
    keys = [] if keys is None else keys
    for i, key_len in enumerate(NS):
        if i == len(keys):
            key = list(tail[-key_len:]) if len(tail) >= key_len else None
            keys.append((key, 0 if key is None else hash(tuple(key))))
        key, h = keys[i]
        if key is None:  # a tail shorter than the key
            continue
        hits: list[tuple[Sequence[int], int]] = []
        for layer in layers:
            hits += layer.hits(h, PER_KEY - len(hits))
            if len(hits) >= PER_KEY:
                break
        best = None
        for seq, end in hits:  # most recent first: it wins ties
            if end >= len(seq):  # (the tail itself, or nothing after it)
                continue
            back = seq[max(0, end - MAX_MATCH):end]  # what a match can reach, as a list
            if type(back) is not list:
                back = back.tolist()
            if back[-key_len:] != key:  # a hash collision
                continue
            n = key_len
            limit = min(MAX_MATCH, end, len(tail))
            while n < limit and back[-n - 1] == tail[-n - 1]:
                n += 1
            if best is None or n > best[0]:
                best = (n, seq, end)
        if best is not None:
            return best
    return None


class NgramIndex:
    """Token sequences indexed by n-gram in a dict: at which (sequence, end) each n-gram ended,
    the `PER_KEY` most recent per key. Grown a token at a time (~320 bytes a token)."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {}
        # hash of an n-gram -> where it ended, (sequence id << 32 | end), one int or a list
        # of the most recent: ~1/3 of the bytes of tuples (a hash collision only costs a
        # lookup: the tokens are compared)
        self._where: dict[int, int | list[int]] = {}
        self._indexed: dict[int, int] = {}  # sequence id -> n-grams ending up to here indexed
        self._next_id = 0

    def add(self, tokens: Sequence[int], start: int = 0,
            hashed: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """Index a sequence (kept by reference: `extend` it by appending and calling `grow`),
        but for its n-grams ending up to `start` (another index holds those); `hashed` =
        `ngrams(tokens, start)`, their keys computed already."""
        sid = self._next_id
        self._next_id += 1
        self.seqs[sid] = tokens if isinstance(tokens, list) else list(tokens)
        self._indexed[sid] = start
        if hashed is not None:
            self._put(hashed[0][::-1].tolist(), (hashed[1][::-1] | sid << 32).tolist())
            self._indexed[sid] = len(tokens)
        self.grow(sid)
        return sid

    def _put(self, keys: list[int], ats: list[int]) -> None:
        where = self._where
        for key, at in zip(keys, ats):
            hits = where.get(key)
            if hits is None:
                where[key] = at  # most keys occur once: an int, not a list
            elif isinstance(hits, int):
                where[key] = [hits, at]
            else:
                hits.append(at)
                if len(hits) > PER_KEY:
                    del hits[0]

    def grow(self, sid: int) -> None:
        """Index the tokens appended to sequence `sid` since the last call."""
        seq, start = self.seqs[sid], self._indexed[sid]
        keys, ats = [], []
        for end in range(max(start + 1, N), len(seq) + 1):
            at = sid << 32 | end
            for n in NS:
                if n <= end:
                    keys.append(hash(tuple(seq[end - n:end])))
                    ats.append(at)
        self._put(keys, ats)
        self._indexed[sid] = len(seq)

    def hits(self, key: int, limit: int) -> list[tuple[list[int], int]]:
        """(sequence, end) of the `limit` most recent occurrences of `key`."""
        hits = self._where.get(key)
        if hits is None:
            return []
        if isinstance(hits, int):
            return [(self.seqs[hits >> 32], hits & _END)][:limit]
        return [(self.seqs[at >> 32], at & _END) for at in reversed(hits[-limit:])]

    def best(self, tail: Sequence[int], keys: Keys | None = None
             ) -> tuple[int, list[int], int] | None:
        return best_match(tail, (self,), keys)


_X1, _X2, _X5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def _hash_ngrams(tokens: np.ndarray, first: int) -> list[np.ndarray]:
    """hash(tuple(tokens[e - n:e])) for each n in NS and each end e from `first` on:
    CPython's tuple hash (xxHash's rounds over the items' hashes, an int's being itself),
    vectorised; the n-grams ending at e share their last rounds' tokens, so one pass."""
    lanes = tokens.astype(np.int64)
    lanes[lanes == -1] = -2  # hash(-1) == -2
    lanes = lanes.view(np.uint64) * np.uint64(_X2)
    m = len(tokens) - first + 1
    acc = np.empty((len(NS), m), np.uint64)
    rows = 0
    for i in range(-NS[0], 0):
        while rows < len(NS) and NS[rows] >= -i:  # an n-gram's first token: its rounds start
            acc[rows] = _X5
            rows += 1
        rounds = acc[:rows]
        rounds += lanes[first + i:first + i + m]
        top = rounds >> np.uint64(33)
        rounds <<= np.uint64(31)
        rounds |= top
        rounds *= np.uint64(_X1)
    acc += np.array([n ^ _X5 ^ 3527539 for n in NS], np.uint64)[:, None]
    acc[acc == np.uint64(2**64 - 1)] = 1546275796
    return list(acc.view(np.int64))


def _hash_ngrams_slowly(tokens: np.ndarray, first: int) -> list[np.ndarray]:
    seq = tokens.tolist()
    return [np.array([hash(tuple(seq[e - n:e])) for e in range(first, len(seq) + 1)], np.int64)
            for n in NS]


_probe = np.array([0, 1, -1, 5, 31999, 2**31 - 1, 7, 7, 7, 255, 256, 100000], np.int32)
if not all(np.array_equal(a, b) for a, b in zip(_hash_ngrams(_probe, NS[0]),
                                                _hash_ngrams_slowly(_probe, NS[0]))):
    _hash_ngrams = _hash_ngrams_slowly  # noqa: F811 (not CPython's hash: the same keys, slowly)


def ngrams(tokens: Sequence[int], start: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, ends) of the n-grams of `tokens` ending past `start`, the most recent first
    for each n, hashed at once."""
    first = max(start + 1, N)
    if first > len(tokens):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # the n-grams ending from `first` on: NS[0] tokens back, those missing before 0 zeros
    lead = NS[0] - min(first, NS[0])
    lo = first + lead - NS[0]
    arr = (np.frombuffer(tokens, np.int32)[lo:] if isinstance(tokens, array) else
           np.array(tokens[lo:], np.int32))
    arr = np.concatenate([np.zeros(lead, np.int32), arr]) if lead else arr
    keys, ends = [], []
    for n, hashed in zip(NS, _hash_ngrams(arr, NS[0])):
        skip = max(0, n - first)  # ends shorter than the n-gram
        keys.append(hashed[skip:][::-1])
        ends.append(np.arange(len(tokens), first + skip - 1, -1, dtype=np.int64))
    return np.concatenate(keys), np.concatenate(ends)
