"""Draft tokens without a draft model: n-gram lookup over what a request can see.

A request drafts from its own tokens (prompt and output: prompt lookup), from the token
sequences its caller hands it (other nodes of its conversation tree: sibling branches, earlier
answers, tool outputs) and from a bounded index of its namespace's recent outputs (suffix
decoding's global tree, as a FIFO). Never from another namespace: a draft from another
tenant's text would leak it through timing.

Each source is indexed by its 12-, 6- and 3-grams; a lookup takes the longest of those the end
of the sequence has occurred as, extends each earlier occurrence backwards to measure how long
the match is, and drafts what followed the longest (most recent on ties). The longer keys find
the right place in a run that repeats one token or phrase many times, where the last few
occurrences of a trigram all sit at the run's end. The draft's length follows the match length and
the request's recent acceptance, and a request whose drafts keep failing stops drafting for
a while (longer each time), so chatty text pays nothing. Knows nothing about models, caches or
sampling: the scheduler verifies what this proposes.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

__all__ = ["DraftSources", "Drafter", "NgramIndex", "RecentOutputs"]

_NS = (12, 6, 3)  # lookup keys: the last n tokens, longest first
_N = _NS[-1]
_PER_KEY = 4  # occurrences kept per key (the most recent)
_MAX_MATCH = 32  # how far back a match is measured
MAX_DRAFT = 24  # tokens verified beside the last one, at most
_CONTEXT = 16  # prompt tokens kept before a recent output


class NgramIndex:
    """Token sequences indexed by n-gram: at which (sequence, end) each n-gram ended."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {}
        # hash of an n-gram -> where it ended, (sequence id << 32 | end), one int or a list
        # of the most recent: ~1/3 of the bytes of tuples (a hash collision only costs a
        # lookup: the tokens are compared)
        self._where: dict[int, int | list[int]] = {}
        self._indexed: dict[int, int] = {}  # sequence id -> tokens indexed so far
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
        where = self._where
        for end in range(max(start, _N), len(seq) + 1):
            at = sid << 32 | end
            for n in _NS:
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
                    if len(hits) > _PER_KEY:
                        del hits[0]
        self._indexed[sid] = len(seq)

    def drop(self, sid: int) -> None:
        self.seqs.pop(sid, None)
        self._indexed.pop(sid, None)

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
        for key_len in _NS:
            if len(tail) < key_len:
                continue
            best = None
            key = list(tail[-key_len:])
            hits = self._where.get(hash(tuple(key)), ())
            for at in reversed([hits] if isinstance(hits, int) else hits):
                # most recent first: it wins ties
                sid, end = at >> 32, at & 0xFFFFFFFF
                if (sid, end) == skip:
                    continue
                seq = self.seqs.get(sid)
                if seq is None or end >= len(seq) or seq[end - key_len:end] != key:
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


class RecentOutputs:
    """A namespace's recent outputs, at most `max_tokens` of them, oldest dropped first."""

    def __init__(self, max_tokens: int = 65536):
        self.max_tokens = max_tokens
        self.index = NgramIndex()
        self._order: deque[tuple[int, int]] = deque()
        self.tokens = 0
        self._dropped = 0

    def add(self, tokens: Sequence[int]) -> None:
        if len(tokens) < _N + 1:
            return
        tokens = list(tokens[-self.max_tokens:])
        self._order.append((self.index.add(tokens), len(tokens)))
        self.tokens += len(tokens)
        self.shrink(self.max_tokens)

    def shrink(self, max_tokens: int) -> int:
        """Drop the oldest outputs until at most `max_tokens` tokens are kept; returns how
        many tokens were dropped."""
        before = self.tokens
        while self.tokens > max_tokens:
            sid, n = self._order.popleft()
            self.index.drop(sid)
            self.tokens -= n
            self._dropped += n
        if self._dropped > self.max_tokens:  # stale occurrences outnumber live ones
            self.index.prune()
            self._dropped = 0
        return before - self.tokens


class Drafter:
    """Proposes draft tokens for one request and learns from how many were accepted."""

    def __init__(self, tokens: list[int], extra: Sequence[Sequence[int]] = (),
                 recent: RecentOutputs | None = None, max_draft: int = MAX_DRAFT):
        self.own = NgramIndex()
        self._sid = self.own.add(tokens)  # the request's live token list, grown as it decodes
        for seq in extra:
            if len(seq) > _N:
                self.own.add(list(seq))
        self.recent = recent
        self.max_draft = max_draft
        self.cap = 8  # current draft length ceiling, adapted to acceptance
        self._misses = 0  # verify steps in a row that accepted nothing
        self._cool = 0  # steps left without drafting
        self._backoff = 4

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens that may come next ([] when nothing worth verifying)."""
        if self._cool:
            self._cool -= 1
            return []
        if limit < 1:
            return []
        tokens = self.own.seqs[self._sid]
        self.own.grow(self._sid)
        found = self.own.best(tokens, skip=(self._sid, len(tokens)))
        if self.recent is not None:
            other = self.recent.index.best(tokens)
            if other is not None and (found is None or other[0] > found[0]):
                found = other
        if found is None:
            return []
        n, seq, end = found
        # longer matches earn longer drafts; the cap follows recent acceptance
        k = min(limit, self.cap, self.max_draft, 2 * n)
        return list(seq[end:end + k])

    def feedback(self, drafted: int, accepted: int) -> None:
        """`accepted` of `drafted` tokens were the model's own."""
        if accepted == drafted:
            self.cap = min(self.max_draft, self.cap * 2)
        else:
            self.cap = max(2, min(self.cap, accepted + 2))
        if accepted == 0:
            self._misses += 1
            if self._misses >= 3:  # this text does not repeat: stop paying for verifies
                self._cool, self._misses = self._backoff, 0
                self._backoff = min(256, self._backoff * 2)
        else:
            self._misses = 0
            self._backoff = 4


def _env_tokens(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{name}={value!r} is not a token count; give a whole number >= 0 "
                         f"(the default is {default}).")
    return n


class DraftSources:
    """An engine's draft sources beyond a request's own: each namespace's recent outputs, at
    most `max_tokens` a namespace and `max_total` in all (the least recently used namespace
    gives up its oldest first). The index holds ~300 bytes a token, so the default total is
    ~40 MB however many tenants a server has; FORKV_RECENT_TOKENS sets another total."""

    def __init__(self, max_namespaces: int = 64, max_tokens: int = 65536,
                 max_total: int | None = None):
        if max_total is None:
            max_total = _env_tokens("FORKV_RECENT_TOKENS", 131072)
        self.max_namespaces = max_namespaces
        self.max_tokens = min(max_tokens, max_total)
        self.max_total = max_total
        self.total = 0  # tokens kept over all namespaces
        self._recent: dict[str, RecentOutputs] = {}  # insertion order = least recently used

    def _of(self, namespace: str) -> RecentOutputs:
        recent = self._recent.pop(namespace, None) or RecentOutputs(self.max_tokens)
        self._recent[namespace] = recent
        while len(self._recent) > self.max_namespaces:
            self._forget(next(iter(self._recent)))
        return recent

    def _forget(self, namespace: str) -> None:
        self.total -= self._recent.pop(namespace).tokens

    def drafter(self, tokens: list[int], extra: Sequence[Sequence[int]], namespace: str
                ) -> Drafter:
        return Drafter(tokens, extra, self._of(namespace))

    def finished(self, namespace: str, tokens: Sequence[int], prompt_len: int) -> None:
        """A request of `namespace` generated `tokens[prompt_len:]`: later ones may draft
        from it. The prompt's last tokens come along, so that a request that asks the same
        again drafts from its first generated token on."""
        if len(tokens) <= prompt_len:
            return
        recent = self._of(namespace)
        before = recent.tokens
        recent.add(tokens[max(0, prompt_len - _CONTEXT):])
        self.total += recent.tokens - before
        while self.total > self.max_total:
            oldest = next(iter(self._recent))
            other = self._recent[oldest]
            if other is recent or other.tokens <= self.total - self.max_total:
                if other is recent:  # the only one left: it keeps the newest
                    self.total -= recent.shrink(recent.tokens - (self.total - self.max_total))
                    break
                self._forget(oldest)
            else:
                self.total -= other.shrink(other.tokens - (self.total - self.max_total))
