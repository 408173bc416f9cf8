from forkv.engine.cache.blocks import BlockKeyer, tokens_bytes

FP = b"\x01" * 32


def test_keys_cover_full_blocks_only():
    k = BlockKeyer(FP, 4)
    assert len(k.keys(list(range(11)))) == 2
    assert len(k.keys(list(range(12)))) == 3


def test_keys_are_chained():
    k = BlockKeyer(FP, 4)
    a = k.keys([1, 2, 3, 4, 5, 6, 7, 8])
    b = k.keys([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix


def test_chain_continues_incrementally():
    k = BlockKeyer(FP, 4)
    toks = list(range(20))
    full = k.keys(toks)
    assert k.keys(toks, start=2, prev=full[1]) == full[2:]


def test_seed_separates_models_sizes_and_namespaces():
    toks = list(range(8))
    base = BlockKeyer(FP, 4).keys(toks)
    assert BlockKeyer(b"\x02" * 32, 4).keys(toks)[0] != base[0]
    assert BlockKeyer(FP, 4, "tenant-a").keys(toks)[0] != base[0]
    assert BlockKeyer(FP, 4, "tenant-a").keys(toks) != BlockKeyer(FP, 4, "tenant-b").keys(toks)
    assert BlockKeyer(FP, 8).keys(toks)[0] != BlockKeyer(FP, 4).keys(toks * 2)[1]


def test_extras_change_only_their_block_onwards():
    k = BlockKeyer(FP, 4)
    toks = list(range(12))
    plain = k.keys(toks)
    with_image = k.keys(toks, extras={1: [b"image-hash"]})
    other_image = k.keys(toks, extras={1: [b"other-hash"]})
    assert plain[0] == with_image[0]
    assert plain[1] != with_image[1] != other_image[1]
    assert with_image[2] != plain[2]


def test_tokens_bytes_is_int32_le():
    assert tokens_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_keys_reuse_the_last_run_only_where_its_blocks_are_the_same():
    """A keyer keys only the blocks a run does not share with the last one it keyed; every
    answer equals a chain from scratch (a fresh keyer), whatever order runs come in."""
    import random

    rng = random.Random(4)
    k = BlockKeyer(b"fp", 4)
    base = [rng.randrange(50) for _ in range(40)]
    runs = [base, base + [1, 2, 3, 4, 5], base[:13], base[:21] + [9] + base[22:], base, [],
            base[:3], base[:8] + [7] * 30, base + base]
    for tokens in runs * 2:
        assert k.keys(tokens) == BlockKeyer(b"fp", 4).keys(tokens), tokens
    got = k.keys(base)
    got.append(b"x")  # a caller's list is its own
    assert k.keys(base) == BlockKeyer(b"fp", 4).keys(base)


def test_shared_prefix_counts_leading_items_of_any_sequences():
    from array import array

    from forkv.engine.cache.blocks import shared_prefix

    a = list(range(300))
    b = a[:250] + [-1] + a[251:]
    for x, y in ((a, b), (array("i", a), array("i", b)), (a, array("i", b)), (tuple(a), b)):
        assert shared_prefix(x, y) == 250 and shared_prefix(y, x) == 250
    assert shared_prefix(a, a[:40]) == 40 and shared_prefix([], a) == 0
    assert shared_prefix(a, a) == 300 and shared_prefix(a, list(a)) == 300
    assert shared_prefix(b, a[:250]) == 250 and shared_prefix(a[:251], b) == 250
    keys = [bytes([i]) for i in range(9)]
    assert shared_prefix(keys, keys[:5] + [b"x"]) == 5
