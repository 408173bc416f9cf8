"""Draft tokens without a draft model: n-gram lookup over what a request can see.

A request drafts from its own tokens (prompt and output: prompt lookup), from the token
sequences its caller hands it (other nodes of its conversation tree: sibling branches, earlier
answers, tool outputs) and from a bounded index of its namespace's recent outputs (suffix
decoding's global tree, as a FIFO). Never from another namespace: a draft from another
tenant's text would leak it through timing.

Each source is indexed by its n-grams (ngrams.py), and a draft is what followed the longest
match of the sequence's end. The draft's length follows the match length and
the request's recent acceptance, and a request whose drafts keep failing, or whose
speculating steps decode slower than plain ones (timed: pace.py), stops drafting for a while
(longer each time), so chatty text pays next to nothing. A finished request's own index is
kept a while, frozen compact, for the next request of its namespace that starts with the same
tokens (a chat's next turn), which reads it beneath an index of its new tokens only and freezes
the two together when it finishes: a turn costs its own tokens, not the conversation's. Knows
nothing about models, caches or sampling: the scheduler verifies what this proposes.
"""

from __future__ import annotations

import os
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..cache.blocks import shared_prefix
from .ngrams import N as _N
from .ngram_log import NgramLog
from .ngrams import MAX_MATCH, NgramIndex, best_match, ngrams

__all__ = ["DraftSources", "Drafter", "NgramIndex", "NgramLog", "RecentOutputs"]

MAX_DRAFT = 24  # tokens verified beside the last one, at most
_CONTEXT = 16  # prompt tokens kept before a recent output
# A finished request's own index is kept for the next request of its namespace that starts
# with the same tokens (the next turn of a chat): that one indexes its new tokens only.
_KEPT_PER_NAMESPACE = 4
_KEPT = 16  # kept indexes in all
_MIN_SHARED = 64  # tokens a request shares with a kept index to take it over
# Lookups in a row that found no match before a request's next step runs ahead of it (a step
# taken back because a draft came costs a whole decode step; one that ran ahead saves ~10%).
_QUIET = 2
# The shortest match that wakes a quiet drafter once most of what it drafted was refused: its
# row's next step is queued, and taking it back costs a step, which a 3-token match in text that
# does not repeat seldom pays back (Gemma 3, sampled chat: 2 of 16 drafted tokens accepted,
# speculation 0.95x off).
_WAKE = 6
# What speculating saved or lost, in plain steps' time (pace.py): a refused draft costs ~2-3
# (the verify, the queued step it takes back, the next step held back; Gemma 3 270M, Zen 4),
# so two or so refused drafts in text that does not repeat rest a drafter, while text that
# does banks enough credit that a refused draft or a noisy step does not.
_DEBT = 3
_CREDIT = 8


_MIN_PRUNE = 1024  # dropped tokens before a prune, however few are live


class RecentOutputs:
    """A namespace's recent outputs, at most `max_tokens` of them, oldest dropped first."""

    def __init__(self, max_tokens: int = 65536):
        self.max_tokens = max_tokens
        self.index = NgramLog()
        self._order: deque[tuple[int, int]] = deque()
        self.tokens = 0
        self._dropped = 0

    def add(self, tokens: Sequence[int]) -> None:
        if len(tokens) < _N + 1:
            return
        tokens = array("i", tokens[-self.max_tokens:])
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
        # stale occurrences outnumber live ones: forget them (amortised O(1) a dropped token).
        # Not `> max_tokens`: a namespace kept far below its own cap by the sources' total
        # (32 tenants sharing 8K tokens) would pile up 32 x 8K tokens' stale keys that way,
        # the growth a 30-minute soak showed (~3 MiB a minute, mlx's memory flat).
        if self._dropped > max(self.tokens, min(self.max_tokens, _MIN_PRUNE)):
            self.index.prune()
            self._dropped = 0
        return before - self.tokens


class Drafter:
    """Proposes draft tokens for one request and learns from how many were accepted."""

    def __init__(self, tokens: list[int], extra: Sequence[Sequence[int]] = (),
                 recent: RecentOutputs | None = None, max_draft: int = MAX_DRAFT,
                 kept: tuple[NgramLog, int] | None = None, paced: bool = True):
        """`kept` = (index, shared tokens): a finished request's own tokens, frozen, whose
        first `shared` are those of `tokens`, taken over (nothing else may hold it): it is read
        beneath `own`, which indexes the tokens past `shared` only. `paced`: speculating steps
        slower than plain ones rest it (speculate="auto"; "on" drafts wherever it finds)."""
        self.tokens = tokens  # the request's live token list, grown as it decodes
        self.own: NgramIndex | None = NgramIndex()
        self.base: NgramLog | None = None
        self._held: array = array("i")  # the base's tokens, those `tokens` starts with
        if kept is not None:
            self.base, shared = kept
            self._held = self.base.rebase(0, tokens, shared)
        # hashed at once, and kept for the freeze: a finished request hashes its output only
        self._upto = len(tokens)
        self._hashed = ngrams(tokens, len(self._held))
        self._sid = self.own.add(tokens, len(self._held), self._hashed)  # 0, as in the base
        for seq in extra:
            if len(seq) > _N:
                self.own.add(list(seq), 0, ngrams(seq, 0))
        self.recent = recent
        self.max_draft = max_draft
        self.cap = 8  # current draft length ceiling, adapted to acceptance
        self._misses = 0  # verify steps in a row that accepted nothing
        self._cool = 0  # steps left without drafting
        self._backoff = 4
        self._dry = 0  # lookups in a row that found nothing to draft
        self._drafted = self._accepted = 0  # over the request
        self._balance = 0.0  # plain steps speculating saved, net (`spent`)
        self._need = 0  # the shortest match drafted from: raised while speculating does not pay
        self.paced = paced

    @property
    def quiet(self) -> bool:
        """Whether the next `draft` will likely propose nothing: cooling down, or the last
        lookups found no match (the scheduler then queues the next step ahead, and takes it
        back if a draft comes after all)."""
        return self._cool > 0 or self._dry >= _QUIET

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens that may come next ([] when nothing worth verifying)."""
        if self._cool:
            self._cool -= 1
            return []
        if limit < 1:
            return []
        assert self.own is not None, "a finished request's drafter drafts no more"
        tokens = self.tokens
        self.own.grow(self._sid)
        keys = []  # the tail's keys, hashed once for every index asked
        found = best_match(tokens, (self.own,) if self.base is None else (self.own, self.base),
                           keys)
        if self.recent is not None and (found is None or found[0] < MAX_MATCH):
            other = self.recent.index.best(tokens, keys)  # (it could not match longer)
            if other is not None and (found is None or other[0] > found[0]):
                found = other
        if found is None or found[0] < self._need or (
                self._dry >= _QUIET and found[0] < _WAKE and 2 * self._accepted < self._drafted):
            self._dry += 1
            return []
        self._dry = 0
        n, seq, end = found
        # longer matches earn longer drafts; the cap follows recent acceptance
        k = min(limit, self.cap, self.max_draft, 2 * n)
        return list(seq[end:end + k])

    def retire(self, keep: bool = True) -> NgramLog | None:
        """A finished request's own tokens and their n-grams, frozen compact to be handed on
        (`keep`; work in the tokens past the base's): this drafter drafts no more."""
        base, self.own, self.base = self.base, None, None
        held, hashed, self._held, self._hashed = self._held, self._hashed, array("i"), None
        if not keep:
            return None
        base = base if base is not None else NgramLog()
        base.extend(0, held + array("i", self.tokens[len(held):]), self._upto, hashed)
        return base

    def feedback(self, drafted: int, accepted: int) -> None:
        """`accepted` of `drafted` tokens were the model's own."""
        self._drafted += drafted
        self._accepted += accepted
        if accepted == drafted:
            self.cap = min(self.max_draft, self.cap * 2)
        else:
            self.cap = max(2, min(self.cap, accepted + 2))
        if accepted == 0:
            self._misses += 1
            # the next steps run ahead: another draft right after a refused one is rare, and
            # a step held back for one costs more than taking a queued step back then
            self._dry = _QUIET
            if self._misses >= 3:  # this text does not repeat: stop paying for verifies
                self._rest()
        else:
            self._misses = 0
            if 2 * accepted >= drafted:  # (a draft mostly refused resets no backoff)
                self._backoff = 4

    def spent(self, seconds: float, tokens: int, plain_s: float | None) -> None:
        """A step that speculated (verified, or was kept from running ahead to draft) took
        `seconds` for `tokens`; plain steps take `plain_s` a token (None: not measured yet).
        What speculating saved or lost is kept as a balance in plain steps, its credit
        capped: a drafter in debt past `_DEBT` rests a while (longer each time) and then
        drafts from longer matches only (pace.py)."""
        if not self.paced or not plain_s:
            return
        self._balance = min(_CREDIT, self._balance + tokens - seconds / plain_s)
        if self._balance < -_DEBT:
            # what drafts there are come from longer matches, the likelier to hold
            self._need = min(MAX_MATCH, max(2 * _WAKE, 2 * self._need))
            self._rest()
        elif self._balance >= _CREDIT:  # paying well: shorter matches may draft again
            self._backoff = 4
            self._need //= 2

    def _rest(self) -> None:
        self._cool, self._misses = self._backoff, 0
        self._backoff = min(256, self._backoff * 2)
        self._balance = 0.0


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


@dataclass(slots=True)
class _Kept:
    """A finished request's own index, kept for its namespace's next request."""

    namespace: str
    index: NgramLog  # of one sequence, id 0: the request's tokens (not its extras)
    tokens: int
    # the same tokens as a list, compared with the next request's list by slices (the two
    # mostly hold the same int objects): packing a deep prompt into an array to compare it
    # with the index's cost ~0.1 ms a request
    ids: list[int]


class DraftSources:
    """An engine's draft sources beyond a request's own: each namespace's recent outputs, at
    most `max_tokens` a namespace and `max_total` in all (the least recently used namespace
    gives up its oldest first). The index holds ~70 bytes a token (tracemalloc, full; ~320 as
    the dict it was), so the default total is ~9 MB however many tenants a server has;
    FORKV_RECENT_TOKENS sets another total. Finished requests' own indexes are kept too, frozen
    (~60 bytes a token, and their tokens as a list for the takeover's compare: 8 more, 36
    where no other list holds the same ints), a few a namespace and `max_total` tokens in all,
    for the next request that starts with the same tokens (taken over only within a
    namespace)."""

    def __init__(self, max_namespaces: int = 64, max_tokens: int = 65536,
                 max_total: int | None = None):
        if max_total is None:
            max_total = _env_tokens("FORKV_RECENT_TOKENS", 131072)
        self.max_namespaces = max_namespaces
        self.max_tokens = min(max_tokens, max_total)
        self.max_total = max_total
        self.total = 0  # tokens kept over all namespaces
        self._recent: dict[str, RecentOutputs] = {}  # insertion order = least recently used
        self._kept: dict[int, _Kept] = {}  # oldest first
        self._kept_ids = 0
        self.kept_tokens = 0

    def _of(self, namespace: str) -> RecentOutputs:
        recent = self._recent.pop(namespace, None) or RecentOutputs(self.max_tokens)
        self._recent[namespace] = recent
        while len(self._recent) > self.max_namespaces:
            self._forget(next(iter(self._recent)))
        return recent

    def _forget(self, namespace: str) -> None:
        self.total -= self._recent.pop(namespace).tokens

    def drafter(self, tokens: list[int], extra: Sequence[Sequence[int]], namespace: str,
                paced: bool = True) -> Drafter:
        return Drafter(tokens, extra, self._of(namespace), kept=self._take(namespace, tokens),
                       paced=paced)

    def _take(self, namespace: str, tokens: list[int]) -> tuple[NgramLog, int] | None:
        """The kept index of `namespace` that shares the longest prefix with `tokens`, taken
        out of the pool, if rebasing it is cheaper than indexing `tokens` afresh."""
        best, shared = None, 0
        for kid, kept in self._kept.items():
            if kept.namespace != namespace:  # never another tenant's: its text would leak
                continue
            n = shared_prefix(kept.ids, tokens)  # lists, by slices, in C
            if n > shared:
                best, shared = kid, n
        # rebasing takes out what follows the shared tokens again
        if best is None or shared < _MIN_SHARED or 2 * shared <= self._kept[best].tokens:
            return None
        kept = self._kept.pop(best)
        self.kept_tokens -= kept.tokens
        return kept.index, shared

    def _keep(self, namespace: str, drafter: Drafter) -> None:
        size = len(drafter.tokens)
        index = drafter.retire(keep=_MIN_SHARED <= size <= self.max_total)
        if index is None:
            return
        mine = [kid for kid, k in self._kept.items() if k.namespace == namespace]
        if len(mine) >= _KEPT_PER_NAMESPACE:
            self.kept_tokens -= self._kept.pop(mine[0]).tokens
        self._kept[self._kept_ids] = _Kept(namespace, index, size, list(drafter.tokens))
        self._kept_ids += 1
        self.kept_tokens += size
        while self.kept_tokens > self.max_total or len(self._kept) > _KEPT:
            self.kept_tokens -= self._kept.pop(next(iter(self._kept))).tokens

    def finished(self, namespace: str, tokens: Sequence[int], prompt_len: int,
                 drafter: Drafter | None = None) -> None:
        """A request of `namespace` generated `tokens[prompt_len:]`: later ones may draft
        from it. The prompt's last tokens come along, so that a request that asks the same
        again drafts from its first generated token on. Its `drafter` hands its own index on
        to the namespace's next request that starts the same way."""
        if drafter is not None:
            self._keep(namespace, drafter)
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
