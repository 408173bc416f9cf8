"""A chat's next turn takes its last turn's n-gram index over and indexes only its new tokens:
it drafts what a fresh index of the same tokens would, never from another namespace's index,
and the kept indexes stay bounded. (The drafter's other pieces: test_speculate.py.)
"""

from __future__ import annotations

import random

from forkv.engine.request.drafts import Drafter, DraftSources
from forkv.engine.request.ngram_log import NgramLog
from forkv.engine.request.ngrams import NS, NgramIndex


def _text(rng: random.Random, n: int, vocab: int = 300) -> list[int]:
    """Text-like tokens: a few of them are most of it, so n-grams repeat."""
    weights = [1 / (i + 1) for i in range(vocab)]
    return rng.choices(range(vocab), weights, k=n)


def _decode(drafters: list[Drafter], answer: list[int]) -> list[list[list[int]]]:
    """Feed `answer` to each drafter a token at a time; the drafts each proposed on the way."""
    seen = [[] for _ in drafters]
    for tok in answer:
        for d, out in zip(drafters, seen):
            draft = d.draft(24)
            out.append(draft)
            if draft:
                d.feedback(len(draft), 1 if draft[0] == tok else 0)
            d.tokens.append(tok)
    return seen


def _check_entries(index: NgramIndex) -> None:
    """Every occurrence the index holds is one of a live sequence, at its stated place, once."""
    for key, hits in index._where.items():
        hits = [hits] if isinstance(hits, int) else hits
        assert len(hits) == len(set(hits)), "an occurrence indexed twice"
        for at in hits:
            sid, end = at >> 32, at & 0xFFFFFFFF
            assert sid in index.seqs, "an occurrence of a forgotten sequence"
            seq = index.seqs[sid]
            assert end <= index._indexed[sid]
            assert any(n <= end and hash(tuple(seq[end - n:end])) == key for n in NS)


def _check_log(index: NgramLog, upto: dict[int, int] | None = None) -> None:
    """Every occurrence the log holds is one of a live sequence, at its stated place (up to
    `upto`'s end for a sequence), once; its segments are sorted for lookups."""
    seen: set[tuple[int, int]] = set()
    for seg in index._segs:
        keys, ats = seg.keys.tolist(), seg.at.tolist()
        assert sorted(zip(keys, [-a for a in ats])) == list(zip(keys, [-a for a in ats]))
        pairs = set(zip(keys, ats))
        assert len(pairs) == len(keys) and not pairs & seen, "an occurrence indexed twice"
        seen |= pairs
        for key, at in pairs:
            sid, end = at >> 32, at & 0xFFFFFFFF
            assert sid in index.seqs, "an occurrence of a forgotten sequence"
            seq = list(index.seqs[sid])
            assert end <= (upto or {}).get(sid, len(seq))
            assert any(n <= end and hash(tuple(seq[end - n:end])) == key for n in NS)


def test_a_chats_next_turn_drafts_as_a_fresh_index_would():
    rng = random.Random(1)
    sources = DraftSources()
    prompt = _text(rng, 400)
    extras = [_text(rng, 60)]
    taken = None
    for turn in range(8):
        live = list(prompt)
        d = sources.drafter(live, extras, "a")
        if turn:
            assert d.base is taken, "the last turn's index was not taken over"
            shared = len(d._held)
            _check_log(d.base, {0: shared})
            assert d.own._indexed[0] == len(live) and shared > len(live) - 60  # new ones only
        fresh = Drafter(list(prompt), extras, sources._of("a"))
        answer = _text(rng, 40) + prompt[-30:]  # a repeat, so that drafts get accepted
        a, b = _decode([d, fresh], answer)
        assert a == b and any(a)
        _check_entries(d.own)
        sources.finished("a", live, len(prompt), d)
        (taken,) = [k.index for k in sources._kept.values()]
        assert list(taken.seqs[0]) == live  # the request's tokens, not its extras
        _check_log(taken)
        # the next prompt: this one, the answer re-rendered (its last token differs), a new ask
        prompt = live[:-1] + [299] + _text(rng, 50)
        extras = [_text(rng, 30)] if turn % 2 else []


def test_a_rebased_index_holds_no_stale_occurrence():
    rng = random.Random(2)
    for _ in range(30):
        old = _text(rng, rng.randrange(20, 200), vocab=8)  # repeats a lot: long key runs
        index = NgramLog()
        sid = index.add(old)
        index.add(_text(rng, 50, vocab=8))
        cut = rng.randrange(0, len(old))
        new = old[:cut] + _text(rng, rng.randrange(0, 100), vocab=8)
        held = index.rebase(sid, new, cut)
        assert list(held) == old[:cut] and list(index.seqs) == [sid]
        _check_log(index, {sid: cut})
        before = index.num_entries
        index.extend(sid, new, cut)
        assert index.num_entries - before == sum(max(0, len(new) - max(cut, n - 1)) for n in NS)
        _check_log(index)
        assert list(index.seqs) == [sid]
        # what a lookup finds is in the new tokens, where it says
        for n in range(3, len(new)):
            found = index.best(new[:n])
            if found is not None:
                k, seq, end = found
                assert list(seq) == new and seq[end - k:end].tolist() == new[n - k:n]


def test_another_namespace_never_takes_an_index_over():
    rng = random.Random(3)
    sources = DraftSources()
    prompt = _text(rng, 500)
    mine = sources.drafter(list(prompt), [], "a")
    sources.finished("a", mine.tokens, len(prompt), mine)
    (index,) = [k.index for k in sources._kept.values()]
    theirs = sources.drafter(list(prompt) + [1, 2, 3], [], "b")
    assert theirs.base is None and index in [k.index for k in sources._kept.values()]
    again = sources.drafter(list(prompt) + [1, 2, 3], [], "a")
    assert again.base is index and not sources._kept


def test_a_kept_index_serves_one_live_request():
    rng = random.Random(4)
    sources = DraftSources()
    prompt = _text(rng, 300)
    first = sources.drafter(list(prompt), [], "a")
    sources.finished("a", first.tokens, len(prompt), first)
    assert first.own is None  # a finished request's drafter hands its index on
    one = sources.drafter(prompt + [7], [], "a")
    two = sources.drafter(prompt + [8], [], "a")
    assert one.base is not None and two.base is None
    # a prompt that shares too little builds its own
    other = _text(rng, 300)
    sources.finished("a", one.tokens, len(prompt) + 1, one)
    assert sources.drafter(prompt[:40] + other, [], "a").base is None
    assert len(sources._kept) == 1


def test_kept_indexes_stay_bounded():
    rng = random.Random(5)
    sources = DraftSources(max_total=5000)
    for i in range(60):
        prompt = _text(rng, rng.randrange(100, 900))
        d = sources.drafter(list(prompt), [_text(rng, 50)], f"t{i % 7}")
        sources.finished(f"t{i % 7}", d.tokens, len(prompt), d)
        assert sources.kept_tokens == sum(k.tokens for k in sources._kept.values()) <= 5000
        assert len(sources._kept) <= 16
        for ns in {k.namespace for k in sources._kept.values()}:
            assert sum(k.namespace == ns for k in sources._kept.values()) <= 4
    # a long chat: the index its turns hand on holds 3 occurrences a token of its own
    prompt = _text(rng, 200)
    for _ in range(40):
        d = sources.drafter(list(prompt), [_text(rng, 40)], "chat")
        live = d.tokens
        live += _text(rng, 10)
        d.draft(8)
        sources.finished("chat", live, len(prompt), d)
        prompt = live + _text(rng, 30)
    index = next(k.index for k in sources._kept.values() if k.namespace == "chat")
    assert list(index.seqs) == [0] and index.num_entries <= 3 * len(index.seqs[0])
    assert len(index._segs) <= len(index.seqs[0]).bit_length()


def test_growing_indexes_each_occurrence_once():
    index = NgramIndex()
    seq = [1, 2, 3, 1, 2, 3]
    sid = index.add(seq)
    for tok in [1, 2, 3, 1]:
        seq.append(tok)
        index.grow(sid)
        index.grow(sid)  # nothing new: nothing added
    _check_entries(index)
    hits = index._where[hash((1, 2, 3))]
    assert [at & 0xFFFFFFFF for at in hits] == [3, 6, 9]


def test_a_namespace_kept_small_by_the_total_forgets_its_dropped_outputs():
    """A namespace's index holds keys for about its live tokens, not for everything it has
    dropped, even when the sources' total keeps it far below its own cap."""
    import random

    from forkv.engine.request.drafts import _MIN_PRUNE, RecentOutputs

    rnd = random.Random(0)
    recent = RecentOutputs(max_tokens=65536)
    for _ in range(400):
        recent.add([rnd.randrange(50_000) for _ in range(40)])
        recent.shrink(256)  # what DraftSources does to stay within its total
    assert recent.tokens <= 256
    keys = recent.index.num_entries
    assert keys <= 3 * (recent.tokens + _MIN_PRUNE + 40), keys  # 3 n-gram sizes a position
