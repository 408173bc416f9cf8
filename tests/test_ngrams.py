"""The compact n-gram log (sorted numpy segments) drafts what the dict index it replaced
drafted, for a namespace's recent outputs (added whole, dropped oldest first, pruned) and for a
request's own index taken over from its conversation's last turn (rebased), and holds a
fraction of the bytes. The dict index as it was is kept here as the reference.
"""

from __future__ import annotations

import functools
import itertools
import random
import tracemalloc

import numpy as np

from forkv.engine.request import ngrams
from forkv.engine.request.drafts import Drafter, DraftSources, RecentOutputs
from forkv.engine.request.ngrams import NS, PER_KEY, best_match


class _DictIndex:
    """NgramIndex before the log (d870207): a dict of key -> the `per_key` most recent
    occurrences, sequences dropped, forgotten and rebased in place."""

    def __init__(self, per_key: int = PER_KEY):
        self.per_key, self.seqs, self.where, self.indexed, self.next_id = per_key, {}, {}, {}, 0

    def add(self, tokens: list[int]) -> int:
        sid, self.next_id = self.next_id, self.next_id + 1
        self.seqs[sid], self.indexed[sid] = tokens, 0
        self.grow(sid)
        return sid

    def _occurrences(self, sid: int, start: int):
        seq = self.seqs[sid]
        for end in range(max(start + 1, NS[-1]), len(seq) + 1):
            for n in NS:
                if n <= end:
                    yield hash(tuple(seq[end - n:end])), sid << 32 | end

    def grow(self, sid: int) -> None:
        for key, at in self._occurrences(sid, self.indexed[sid]):
            hits = self.where.setdefault(key, [])
            hits.append(at)
            del hits[:-self.per_key]
        self.indexed[sid] = len(self.seqs[sid])

    def drop(self, sid: int) -> None:
        self.seqs.pop(sid)

    def prune(self) -> None:
        live = {key: [at for at in hits if at >> 32 in self.seqs]
                for key, hits in self.where.items()}
        self.where = {key: hits for key, hits in live.items() if hits}

    def rebase(self, sid: int, tokens: list[int], shared: int) -> None:
        for other in [s for s in self.seqs if s != sid]:
            self.indexed[other] = len(self.seqs[other])
            for key, at in self._occurrences(other, 0):
                if at in self.where.get(key, ()):
                    self.where[key].remove(at)
            self.seqs.pop(other)
        for key, at in self._occurrences(sid, shared):
            if at & 0xFFFFFFFF <= self.indexed[sid] and at in self.where.get(key, ()):
                self.where[key].remove(at)
        self.seqs[sid], self.indexed[sid] = tokens, min(self.indexed[sid], shared)

    def best(self, tail, skip=None):
        for key_len in NS:
            if len(tail) < key_len:
                continue
            best, read, key = None, 0, list(tail[-key_len:])
            for at in reversed(self.where.get(hash(tuple(key)), [])):
                sid, end = at >> 32, at & 0xFFFFFFFF
                seq = self.seqs.get(sid)
                if seq is None:
                    continue
                read += 1
                if read > PER_KEY:
                    break
                if (sid, end) == skip or end >= len(seq) or list(seq[end - key_len:end]) != key:
                    continue
                n = key_len
                while n < min(32, end, len(tail)) and seq[end - n - 1] == tail[-n - 1]:
                    n += 1
                if best is None or n > best[0]:
                    best = (n, seq, end)
            if best is not None:
                return best
        return None


def _same(a, b) -> bool:
    """Two lookups found the same match: its length, place and what follows it."""
    if a is None or b is None:
        return a is b
    (n, seq, end), (m, other, at) = a, b
    return (n, end) == (m, at) and list(seq[end:end + 24]) == list(other[at:at + 24])


@functools.cache
def _weights(vocab: int) -> list[float]:
    return list(itertools.accumulate(1 / (i + 1) for i in range(vocab)))


def _text(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Text-like tokens: a few of them are most of it."""
    return rng.choices(range(vocab), cum_weights=_weights(vocab), k=n)


def _repetitive(rng: random.Random, n: int) -> list[int]:
    """Phrases repeated with edits, runs of one token: many occurrences a key."""
    phrases = [_text(rng, rng.randrange(3, 20), 40) for _ in range(6)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(phrases) if rng.random() < 0.8 else [rng.randrange(40)] * 15
    return out[:n]


def _tails(rng: random.Random, seqs: list[list[int]], vocab: int) -> list[list[int]]:
    tails = []
    for _ in range(40):
        seq = rng.choice(seqs)
        cut = rng.randrange(1, len(seq) + 1)
        tails.append(_text(rng, rng.randrange(0, 5), vocab) + seq[max(0, cut - 40):cut])
    return tails + [_text(rng, 20, vocab) for _ in range(10)]


def test_keys_are_pythons_hash_of_the_ngram():
    rng = np.random.default_rng(0)
    for vocab in (5, 300, 2**31 - 1):
        tokens = rng.integers(0, vocab, 500).astype(np.int32)
        tokens[::37] = -1  # (hash(-1) is -2)
        for n, fast, slow in zip(NS, ngrams._hash_ngrams(tokens, 12),
                                 ngrams._hash_ngrams_slowly(tokens, 12)):
            want = [hash(tuple(tokens[e - n:e].tolist())) for e in range(12, 501)]
            assert fast.tolist() == want and slow.tolist() == want


def test_recent_outputs_draft_as_the_dict_did():
    """Outputs added, dropped oldest first and pruned: every lookup finds what the dict found."""
    for seed, make, vocab in [(0, _text, 50000), (1, _text, 30), (2, _repetitive, 40)]:
        rng = random.Random(seed)
        recent, ref = RecentOutputs(max_tokens=3000), _DictIndex()
        outputs = []
        for i in range(120):
            tokens = make(rng, rng.randrange(1, 200), vocab) if make is _text else \
                make(rng, rng.randrange(1, 200))
            recent.add(tokens)
            if len(tokens) > NS[-1]:
                ref.add(tokens[-3000:])
                outputs.append(tokens)
            if rng.random() < 0.3:
                recent.shrink(rng.randrange(500, 3000))  # what DraftSources does
            for sid in [s for s in ref.seqs if s not in recent.index.seqs]:
                ref.drop(sid)
            if rng.random() < 0.1:
                ref.prune()
            assert list(recent.index.seqs) == list(ref.seqs)
            if i % 10 == 9:
                for tail in _tails(rng, outputs[-30:], vocab):
                    new, old = recent.index.best(tail), ref.best(tail)
                    assert _same(new, old), (seed, i, tail, new, old)


def test_a_taken_over_index_drafts_as_the_rebased_dict_did():
    """A chat's turns take the last turn's frozen index over, and draft, step by step, what
    the dict index rebased in place drafted, and what one with room for every occurrence did
    (the dict kept 2 x PER_KEY a key for what a rebase takes out: it could miss some)."""
    for seed, repetitive in [(3, False), (4, True), (5, True)]:
        rng = random.Random(seed)
        vocab = 300
        sources = DraftSources()
        make = (lambda n: _repetitive(rng, n)) if repetitive else (lambda n: _text(rng, n, vocab))
        prompt = make(300)
        refs: list[_DictIndex] | None = None
        rebased = 0
        for turn in range(8):
            extras = [make(60)] if turn % 3 else []
            live = list(prompt)
            d = sources.drafter(live, extras, "a")
            if d.base is None:
                refs = [_DictIndex(2 * PER_KEY), _DictIndex(10**9)]
                for ref in refs:
                    ref.add(live)
            else:
                rebased += 1
                for ref in refs:
                    ref.rebase(0, live, len(d._held))
                    ref.grow(0)
            for ref in refs:
                for seq in extras:
                    ref.add(list(seq))
            layers = (d.own,) if d.base is None else (d.own, d.base)
            for tok in make(60) + prompt[-40:]:
                d.own.grow(0)
                for ref in refs:
                    ref.grow(0)
                new = best_match(live, layers)
                assert all(_same(new, ref.best(live, skip=(0, len(live)))) for ref in refs)
                live.append(tok)
            sources.finished("a", live, len(prompt), d)
            prompt = live[:-1] + make(rng.randrange(1, 50))
        assert rebased >= 6


def _bytes_a_token(build) -> float:
    tracemalloc.start()
    try:
        held, tokens = build()
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held
    return used / tokens


def test_kept_indexes_hold_under_a_hundred_bytes_a_token():
    rng = random.Random(6)
    outputs = [_text(rng, 400, 32000) for _ in range(80)]  # 32,000 tokens, text-like

    def recent():
        r = RecentOutputs(max_tokens=1 << 20)
        for tokens in outputs:
            r.add(tokens)
        return r, r.tokens

    def kept():
        sources = DraftSources()
        for i, tokens in enumerate(outputs[:16]):  # the pool holds 16
            d = Drafter(list(tokens) * 5)
            sources._keep(f"t{i}", d)
        return sources._kept, sources.kept_tokens

    assert _bytes_a_token(recent) < 100  # the dict held ~330
    assert _bytes_a_token(kept) < 100
