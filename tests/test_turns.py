"""Turn-end checkpoints: a chat's next turn restores right after the last prompt's generation
prompt, bit for bit against a fresh run of the same tokens (turns.py)."""

import random

import pytest

from conftest import load_tiny, scoped_engine
from forkv.engine import Engine
from forkv.engine.cache.blocks import BlockKeyer
from forkv.engine.cache.layout import CacheKind
from forkv.engine.cache.recordstore import RecordStore
from forkv.engine.cache.turns import TurnModel, turn_ends, turn_key, turn_marker
from forkv.engine.request.generate import prefill
from helpers import MemoryDisk

_WORDS = "river stone lamp orbit cedar quartz meadow signal harbor copper".split()


def _engine(lm, **kw):
    kw.setdefault("store", RecordStore(1 << 30, None))
    return scoped_engine(lm, **kw)


def _chat(turns: int, words: int = 60, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You answer briefly. " * 12}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: " +
                         " ".join(rng.choice(_WORDS) for _ in range(words))})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {t}."})
    return messages


@pytest.fixture
def engine():
    """An engine on demo gemma3 tiny with an in-memory store."""
    e = _engine(load_tiny("gemma3"))
    yield e
    e.close()


def _first_turn(engine) -> tuple[list[int], bytes]:
    """Run the second turn's prompt (which ends mid-block); its tokens and turn-end key."""
    first = engine.encode(_chat(2))
    engine.generate(_chat(2), max_tokens=1)
    engine.drain()
    return first, turn_key(engine.checkpointer.keyer, engine.block_keys(first), first, len(first))


def _fresh(lm, tokens, marker, B=256):
    """The exactness reference: a fresh prefill cut at block boundaries and turn ends."""
    model = TurnModel(lm.model, turn_ends(tokens, marker, B))
    return prefill(model, lm.make_cache(), tokens, 0, B)


def test_marker_is_the_generation_prompt():
    lm = load_tiny("gemma3")
    marker = turn_marker(lm.tokenizer)
    assert lm.tokenizer.decode(list(marker)) == "<|im_start|>assistant\n"

    class NoTemplate:
        chat_template = None

    assert turn_marker(NoTemplate()) == ()
    assert turn_marker(None) == ()


def test_turn_ends_follow_each_marker_but_not_block_boundaries():
    marker = (9, 8)
    tokens = [1, 9, 8, 2, 9, 8, 9, 3, 9, 8]
    assert turn_ends(tokens, marker, 256) == [3, 6, 10]
    assert turn_ends(tokens, marker, 3) == [10]  # 3 and 6 are block boundaries
    assert turn_ends(tokens, (), 256) == []
    # Searched as bytes: a match across token boundaries is no turn end
    assert turn_ends([256, 0, 1, 0], (1, 0), 256) == [4]
    assert turn_ends([7, 7, 7], (7, 7), 256) == [2, 3]  # overlapping ends, as token by token


def test_turn_ends_equal_a_token_by_token_search():
    import random

    def naive(tokens, marker, B):
        m = len(marker)
        return [i + m for i in range(len(tokens)) if (i + m) % B and i + m <= len(tokens)
                and list(tokens[i:i + m]) == list(marker)]

    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.choice([0, 1, 2, 256, 65536, 2**31 - 1]) for _ in range(rng.randrange(30))]
        marker = tuple(rng.choice([0, 1, 256]) for _ in range(rng.randrange(1, 3)))
        B = rng.choice([3, 4, 256])
        assert turn_ends(tokens, marker, B) == naive(tokens, marker, B), (tokens, marker, B)


def test_a_turns_ends_search_only_the_tokens_it_does_not_share_with_the_last_call(monkeypatch):
    """`Turns.ends` equals a whole search on every call, while a conversation's next call
    (its prompt, run, render: each extends the one before) packs only the tokens after what
    it shares with the last one: a turn at depth 60 costs its own tokens, not the path's."""
    import random

    import forkv.engine.cache.turns as turns_mod

    packed = []
    pack = turns_mod.tokens_bytes
    monkeypatch.setattr(turns_mod, "tokens_bytes", lambda t: packed.append(len(t)) or pack(t))
    marker = (7, 8)
    turns = turns_mod.Turns(type("Ck", (), {"block_size": 16})(), marker)
    rng = random.Random(1)
    tokens: list[int] = []
    for depth in range(60):
        tokens = tokens + [rng.randrange(10) for _ in range(rng.randrange(3, 12))] + [7, 8]
        for call in (tokens, tokens[:-3], tokens):  # a prompt, a shorter call, the prompt again
            packed.clear()
            assert turns.ends(call) == pack_free_ends(call, marker, 16), depth
            assert sum(packed) <= 12 + 2 * len(marker), (depth, packed)
    other = [rng.randrange(10) for _ in range(50)] + [7, 8]  # an unrelated prompt: searched whole
    assert turns.ends(other) == pack_free_ends(other, marker, 16)


def pack_free_ends(tokens, marker, B):
    m = len(marker)
    return [i + m for i in range(len(tokens) - m + 1)
            if (i + m) % B and list(tokens[i:i + m]) == list(marker)]


def test_turn_ends_change_the_key_seed():
    lm = load_tiny("gemma3")
    engine = _engine(lm)
    tokens = list(range(300))
    plain = BlockKeyer(lm.fingerprint, engine.block_size).keys(tokens)
    assert engine.block_keys(tokens) != plain  # records made without turn ends never match
    engine.close()


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_5", "qwen3", "gemma4"])
def test_next_turn_restores_the_last_prompt_end_exactly(arch):
    import mlx.core as mx

    lm = load_tiny(arch)
    engine = _engine(lm)
    ck = engine.checkpointer
    assert ck.turns is not None, arch
    first = engine.encode(_chat(2))  # ends in a block's middle with the marker
    assert len(first) % engine.block_size and len(first) > engine.block_size
    engine.generate(_chat(2), max_tokens=2)
    engine.drain()
    assert ck.stats.turn_ends_recorded >= 1
    tokens = engine.encode(_chat(3))
    assert tokens[:len(first)] == first
    r = ck.restore_run(tokens)
    assert r.position == len(first)  # not just the block boundary before it
    assert ck.stats.hits["turn_end"] == 1
    got = prefill(ck.model_for(tokens), r.cache, tokens, r.position, engine.block_size)
    want = _fresh(lm, tokens, ck.turns.marker)
    assert mx.array_equal(got, want).item(), arch
    # The engine's own request path: reuses the same prefix, and greedy tokens match a run
    # without checkpoints.
    out = engine.generate(_chat(3), max_tokens=4)
    assert out.timings.reused_tokens == len(first)
    plain = Engine(lm, checkpoints=False)
    assert plain.generate(_chat(3), max_tokens=4).token_ids == out.token_ids
    plain.close()
    engine.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_next_turn_takes_over_the_exact_prompt_cache(arch):
    """An exact request continues the last prompt's cache where every layer is global K/V
    (live.py's hand-off: no records read), with the logits of a restore from the records."""
    lm = load_tiny(arch)
    runs = {}
    for live_mib in (512, 0):  # 0: no live caches, so the records restore
        engine = _engine(lm, live_cache_mib=live_mib)
        first = engine.encode(_chat(2))
        engine.generate(_chat(2), max_tokens=2)
        engine.drain()
        out = engine.generate(_chat(3), max_tokens=4, top_logprobs=0)
        assert out.timings.reused_tokens == len(first), (arch, live_mib)
        live = engine.prefix.live
        runs[live_mib] = (out.token_ids, out.logprobs, live.stats.handed if live.enabled else 0,
                          engine.checkpointer.stats.hits.get("turn_end", 0))
    handed, records = runs[512], runs[0]
    assert handed[:2] == records[:2], arch  # the same tokens, the same logprobs bit for bit
    if arch == "qwen3":  # every layer global: taken over, nothing read from the records
        assert (handed[2], handed[3], records[2], records[3]) == (1, 0, 0, 1)
    else:  # sliding windows cannot be handed over: restored from the records
        assert (handed[2], handed[3]) == (0, 1)


def test_a_replayed_turn_shares_the_later_prompts_kv_comparing_one_block(monkeypatch):
    """An earlier turn asked again (a replayed or forked chat) keeps its exact prompt's entry
    as slices of the later prompt's K/V: both canonical, they are compared from the last block
    boundary before the shorter one's end only, not over the whole chat (live.py); the replay
    still gets the first run's tokens and logprobs bit for bit."""
    import mlx.core as mx

    import forkv.engine.cache.live as live_mod

    compared = []
    share_kv = live_mod._share_kv

    def spy(short, long_, p, check_from=0):
        compared.append((p, check_from))
        share_kv(short, long_, p, check_from)

    monkeypatch.setattr(live_mod, "_share_kv", spy)
    engine = _engine(load_tiny("qwen3"))
    B = engine.block_size
    first = engine.generate(_chat(2), max_tokens=2, top_logprobs=0)
    engine.generate(_chat(3), max_tokens=2)  # takes the first prompt's cache over
    assert not compared
    again = engine.generate(_chat(2), max_tokens=2, top_logprobs=0)
    assert (again.token_ids, again.logprobs) == (first.token_ids, first.logprobs)
    p = len(engine.encode(_chat(2)))
    assert p > 2 * B and compared and {c for c in compared} == {(p, (p - 1) // B * B)}
    entries = sorted(engine.prefix.live.entries.values(), key=lambda e: len(e.tokens))
    short, long_ = entries[0], entries[-1]
    assert len(short.tokens) == p and long_.tokens[:p] == short.tokens
    for a, b in zip(short.cache, long_.cache):  # one buffer: the shorter's are slices
        assert mx.array_equal(a.keys, b.keys[..., :p, :]).item()
    engine.close()


def test_timed_restores_report_read_and_build_seconds(engine):
    """`Checkpointer.timed` (forkv bench restore's hook) sees a turn-end restore's record reads
    and its cache build, and times nothing outside its block."""
    first, _ = _first_turn(engine)
    ck = engine.checkpointer
    assert ck.timings is None
    with ck.timed() as spent:
        r = ck.restore_run(engine.encode(_chat(3)), count=False)
    assert r.position == len(first)
    assert spent["read"] > 0 and spent["build"] > 0 and ck.timings is None


def test_rewind_restores_an_earlier_turn_end():
    import mlx.core as mx

    lm = load_tiny("gemma3")
    engine = _engine(lm)
    ck = engine.checkpointer
    for t in range(1, 6):
        engine.generate(_chat(t), max_tokens=2)
    engine.drain()
    turn2 = engine.encode(_chat(2))
    branch = _chat(2) + [{"role": "assistant", "content": "Another answer."},
                         {"role": "user", "content": "Back here: " + "cedar " * 30}]
    tokens = engine.encode(branch)
    r = ck.restore_run(tokens)
    assert r.position == len(turn2)
    got = prefill(ck.model_for(tokens), r.cache, tokens, r.position, engine.block_size)
    assert mx.array_equal(got, _fresh(lm, tokens, ck.turns.marker)).item()
    engine.close()


def test_a_tampered_turn_end_is_a_miss_and_the_restore_stays_exact():
    import mlx.core as mx

    lm = load_tiny("gemma3")
    disk = MemoryDisk()
    engine = _engine(lm, store=RecordStore(0, disk))  # every record through the disk tier
    ck = engine.checkpointer
    first, key = _first_turn(engine)
    assert (key, CacheKind.EXTRA) in disk.blobs
    blob = bytearray(disk.blobs[(key, CacheKind.EXTRA)])
    blob[len(blob) // 2] ^= 1
    disk.blobs[(key, CacheKind.EXTRA)] = bytes(blob)
    tokens = engine.encode(_chat(3))
    r = ck.restore_run(tokens)
    assert r.position == len(first) // engine.block_size * engine.block_size
    assert ck.stats.misses["turn_end"] == 1  # the disk tier refuses the changed bytes
    got = prefill(ck.model_for(tokens), r.cache, tokens, r.position, engine.block_size)
    assert mx.array_equal(got, _fresh(lm, tokens, ck.turns.marker)).item()
    engine.close()


def test_checkpoint_keys_cover_turn_ends_and_release_drops_them(engine):
    ck = engine.checkpointer
    first, turn = _first_turn(engine)
    keys = engine.checkpoint_keys(first)
    blocks = engine.block_keys(first)
    assert keys[:len(blocks)] == blocks and turn in keys
    assert ck.store.contains(turn, CacheKind.EXTRA)
    engine.release(keys)
    assert not any(ck.store.contains(k, kind) for k in keys for kind in ck.kinds | {"extra"})


def test_models_without_a_chat_template_keep_block_chunks(monkeypatch):
    lm = load_tiny("gemma3")
    inner = getattr(lm.tokenizer, "_tokenizer", lm.tokenizer)  # under mlx-lm's wrapper
    monkeypatch.setattr(inner, "chat_template", None)
    engine = _engine(lm)
    assert engine.checkpointer.turns is None
    tokens = list(range(300))
    assert engine.block_keys(tokens) == BlockKeyer(lm.fingerprint, engine.block_size).keys(tokens)
    engine.close()


def test_a_turn_end_recorded_for_other_tokens_is_rejected_and_dropped(engine):
    from forkv.engine.cache.records import Record

    ck = engine.checkpointer
    first, key = _first_turn(engine)
    good = ck.store.get(key, CacheKind.EXTRA)
    ck.store.discard(key, CacheKind.EXTRA)
    ck.store.put(key, Record(CacheKind.EXTRA, good.block, good.tokens[:-4] + b"\0" * 4,
                             good.arrays))  # what a hash collision would look like
    r = ck.restore_run(engine.encode(_chat(3)))
    assert r.position == len(first) // engine.block_size * engine.block_size
    assert ck.stats.rejected == 1 and not ck.store.contains(key, CacheKind.EXTRA)


def test_forks_of_one_prompt_wait_for_its_turn_end_and_compute_it_once():
    lm = load_tiny("qwen3")
    engine = _engine(lm)
    # Under one block, so no block keys: only the turn end is shared. A reasoning prompt
    # goes on after the generation prompt (here two tokens), so the turn end is restorable.
    base = engine.encode(_chat(1))
    prompt = base + [60, 61]
    handles = [engine.submit(prompt, max_tokens=3, temperature=0.7, seed=i) for i in range(4)]
    results = [h.result() for h in handles]
    assert [r.timings.reused_tokens for r in results] == [0] + [len(base)] * 3
    assert [r.timings.computed_tokens for r in results] == [len(prompt)] + [2] * 3
    plain = Engine(lm, checkpoints=False)
    for i, r in enumerate(results):  # each fork samples what a run without checkpoints does
        assert plain.generate(prompt, max_tokens=3, temperature=0.7, seed=i).token_ids == \
            r.token_ids
    plain.close()
    engine.close()


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_5"])
def test_a_prompt_that_ends_at_a_recorded_turn_end_restores_whole_with_exact_logits(arch):
    """A fork of a final answer or a repeated request asks for exactly the last prompt: its
    turn end's record holds the logits of its last position, so nothing is left to compute,
    and those logits are a fresh run's bit for bit — also when the turn end was recorded
    inside a longer prompt's chunk (a later turn's), not at the end of a run."""
    import mlx.core as mx

    lm = load_tiny(arch)
    B = 256
    longer = _chat(2) + [{"role": "assistant", "content": "Answer 1."},
                         {"role": "user", "content": "Next: " + "cedar " * 300}]
    for recorded_by in (_chat(2), longer):
        engine = _engine(lm)
        ck = engine.checkpointer
        first = engine.encode(_chat(2))
        tokens = engine.encode(recorded_by)
        assert tokens[:len(first)] == first and len(first) % B
        if len(tokens) > len(first):
            assert len(tokens) // B > len(first) // B  # the end fell in an inner chunk
        engine.generate(recorded_by, max_tokens=1)
        engine.drain()
        r = ck.restore_run(first)
        assert r.position == len(first) and r.logits is not None, arch
        want = _fresh(lm, first, ck.turns.marker)
        assert mx.array_equal(r.logits, want).item(), arch
        assert ck.stats.hits["turn_end"] == 1
        engine.close()


def test_forks_of_a_final_prompt_restore_it_whole_and_sample_what_a_fresh_run_does():
    lm = load_tiny("qwen3")
    engine = _engine(lm)
    prompt = engine.encode(_chat(1))  # ends at the generation prompt: a final answer's
    handles = [engine.submit(prompt, max_tokens=3, temperature=0.7, seed=i) for i in range(4)]
    results = [h.result() for h in handles]
    # The first computes the prompt; the others wait for its turn end and compute nothing.
    assert [r.timings.reused_tokens for r in results] == [0] + [len(prompt)] * 3
    assert [r.timings.computed_tokens for r in results] == [len(prompt)] + [0] * 3
    again = engine.generate(prompt, max_tokens=3, temperature=0.7, seed=0)  # a repeat
    assert again.timings.computed_tokens == 0 and again.token_ids == results[0].token_ids
    plain = Engine(lm, checkpoints=False)
    for i, r in enumerate(results):
        assert plain.generate(prompt, max_tokens=3, temperature=0.7, seed=i).token_ids == \
            r.token_ids
    plain.close()
    engine.close()


def test_a_turn_end_record_without_logits_serves_longer_prompts_only(engine):
    """A record made before turn ends held their logits (a persistent store) is no miss for a
    longer prompt and is kept; the prompt it ends computes its last chunk."""
    from forkv.engine.cache.records import Record

    ck = engine.checkpointer
    first, key = _first_turn(engine)
    good = ck.store.get(key, CacheKind.EXTRA)
    assert "logits" in good.arrays
    ck.store.discard(key, CacheKind.EXTRA)
    old = {k: v for k, v in good.arrays.items() if k != "logits"}
    ck.store.put(key, Record(CacheKind.EXTRA, good.block, good.tokens, old, good.namespace))
    r = ck.restore_run(first)
    assert r.position == len(first) // engine.block_size * engine.block_size
    assert r.logits is None and ck.store.contains(key, CacheKind.EXTRA)
    assert ck.restore_run(engine.encode(_chat(3))).position == len(first)
    assert ck.stats.rejected == 0


def test_turn_keys_of_a_longer_run_equal_keys_from_scratch():
    """Turns.keys reuses the keys of ends inside the tokens the last call shared: every answer
    equals one computed alone, in any order of runs and namespaces."""
    import random

    from forkv.engine.cache.blocks import BlockKeyer
    from forkv.engine.cache.turns import Turns, turn_key

    class Ck:
        block_size = 4
        keyer = BlockKeyer(b"fp", 4)

    turns, other = Turns(Ck(), (9, 8)), BlockKeyer(b"fp", 4, "tenant")
    rng = random.Random(2)
    base = [rng.choice([1, 9, 8]) for _ in range(60)]
    runs = [base[:20], base, base[:33], base[:10] + [9, 8] + base[12:], base, base + [9, 8]]
    for tokens in runs * 2:
        for keyer in (Ck.keyer, other):
            keys = keyer.keys(tokens)
            want = {e: turn_key(keyer, keys, tokens, e) for e in turns.ends(tokens)}
            assert turns.keys(tokens, keys, keyer) == want


def test_a_deep_chats_turn_keys_only_its_new_turn_end(monkeypatch):
    """A chat's next turn extends the last call's tokens: Turns.keys keys only the turn ends
    past what the two share (one a turn, not every end of a deep path), copies the rest, and
    still equals keys from scratch, also after a rewind to an earlier turn."""
    from forkv.engine.cache import turns as turns_mod
    from forkv.engine.cache.turns import Turns

    class Ck:
        block_size = 16
        keyer = BlockKeyer(b"fp", 16)

    calls = []
    real = turns_mod.turn_key
    monkeypatch.setattr(turns_mod, "turn_key", lambda *a: calls.append(a[-1]) or real(*a))
    turns, rng, tokens = Turns(Ck(), (9, 8)), random.Random(3), []
    for t in range(80):
        tokens = tokens + [rng.randrange(20, 99) for _ in range(rng.randrange(3, 12))] + [9, 8]
        keys = Ck.keyer.keys(tokens)
        calls.clear()
        got = turns.keys(tokens, keys)
        want = {e: real(Ck.keyer, keys, tokens, e) for e in turn_ends(tokens, (9, 8), 16)}
        assert got == want
        assert len(calls) == (len(tokens) % 16 != 0) <= 1, (t, calls)  # its own end, if any
    rewound = tokens[:len(tokens) // 2]
    keys = Ck.keyer.keys(rewound)
    assert turns.keys(rewound, keys) == {e: real(Ck.keyer, keys, rewound, e)
                                         for e in turn_ends(rewound, (9, 8), 16)}
