"""Tree.record_render (graph/results.py): a record that skips what the last one wrote is the
full record, and a deep path's next turn writes only its own nodes."""

from __future__ import annotations

import hashlib
import random

import forkv.graph.results as results
from forkv.graph import Tree, render
from forkv.graph.render_cache import render_cache
from forkv.graph.testing import ToyTokenizer

BLOCK = 16
_END = ToyTokenizer().special["<|im_end|>"]


def _keys(tokens: list[int], salt: str) -> tuple[list[str], dict[int, str]]:
    """Block keys and turn keys (after each <|im_end|>) as the engine's are: functions of the
    tokens before them, salted by a namespace."""
    def key(n: int) -> str:
        return hashlib.sha256(f"{salt}:{tokens[:n]}".encode()).hexdigest()[:12]

    blocks = [key((i + 1) * BLOCK) for i in range(len(tokens) // BLOCK)]
    turns = {i + 1: key(i + 1) for i, t in enumerate(tokens) if t == _END and (i + 1) % BLOCK}
    return blocks, turns


def _state(tree: Tree) -> list[tuple]:
    return [(n.id, n.span, [(b.index, b.key) for b in n.blocks], list(n.turn_keys))
            for n in tree]


def _build(seed: int) -> tuple[Tree, list[str]]:
    """A branching tree of done turns (the same ids for the same seed) and its leaves."""
    rng = random.Random(seed)
    tree = Tree()
    leaves = [tree.system("You review code.").id]
    for i in range(24):
        parent = tree[rng.choice(leaves[-3:])]  # mostly deepening, sometimes a branch
        user = parent.user(f"ask {i} " + "x" * rng.randrange(1, 40))
        answer = user.final(text=f"answer {i} " + "y" * rng.randrange(0, 30))
        leaves.append(answer.id)
    return tree, leaves


def test_a_record_that_skips_what_the_last_wrote_is_the_full_record():
    for seed in range(4):
        fast, leaves = _build(seed)
        full, _ = _build(seed)
        rng = random.Random(100 + seed)
        tok = ToyTokenizer()
        for step in range(40):
            leaf = rng.choice(leaves)
            salt = rng.choice(["a", "a", "a", "b"])  # now and then another namespace's keys
            for tree, fresh in ((fast, False), (full, True)):
                rp = render(tree, leaf, tok)
                blocks, turns = _keys(rp.token_ids, salt)
                if fresh:
                    render_cache(tree).record = None  # every node written, as before
                tree.record_render(rp, blocks, BLOCK, turns)
            assert _state(fast) == _state(full), (seed, step)


def test_reset_makes_the_next_record_write_every_node():
    tree = Tree()
    user = tree.system("S").user("Q" * 40)
    answer = user.final({"max_tokens": 8})
    tree.attach(answer, "A" * 20)
    tok = ToyTokenizer()
    rp = render(tree, answer, tok)
    tree.record_render(rp, *_keys(rp.token_ids, "a")[:1], BLOCK)
    assert answer.blocks
    tree.reset(answer)
    assert answer.span is None and answer.blocks == []
    tree.attach(answer, "A" * 20)  # the same text again: the same render
    tree.record_render(render(tree, answer, tok), *_keys(rp.token_ids, "a")[:1], BLOCK)
    assert answer.span is not None and answer.blocks  # written again, not skipped


def test_a_deep_paths_next_turn_writes_only_its_own_nodes(monkeypatch):
    """The O(depth) walk over every node of the path (a lookup and a block compare each) does
    not come back: the nodes a turn's record writes do not grow with the depth."""
    written, placed = [], []
    real_range, real_bisect = results.block_range, results.bisect_left
    monkeypatch.setattr(results, "block_range", lambda *a: written.append(1) or real_range(*a))
    monkeypatch.setattr(results, "bisect_left", lambda *a: placed.append(1) or real_bisect(*a))
    tree, tok = Tree(), ToyTokenizer()
    node = tree.system("You review code.")
    counts = {}
    for turn in range(1, 41):
        node = node.user(f"turn {turn}: " + "x" * 30).final({"max_tokens": 8})
        written.clear()
        placed.clear()
        for _ in range(2):  # as the node runner does: the prompt's record, then the path's
            rp = render(tree, node, tok)
            blocks, turns = _keys(rp.token_ids, "a")
            tree.record_render(rp, blocks, BLOCK, turns)
            if node.is_pending:
                tree.attach(node, f"answer {turn}")
        counts[turn] = (len(written), len(placed))
    # (a turn adds 2 nodes and 1 turn end; the path at turn 40 has 81 nodes, 80 turn ends)
    assert max(written for written, _ in counts.values()) <= 8, counts
    assert max(placed for _, placed in counts.values()) <= 4, counts
