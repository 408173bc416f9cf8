"""The issue's acceptance checks, end to end on the sliding-window and hybrid demo models.

Each prune or rewind computes at most the tokens after the last block boundary (or turn end)
of the reused prefix plus the new tokens (asserted from per-node stats); fork k=4 computes the
shared prefix once; a pruned or rewound path generates exactly what a fresh, checkpoint-free run
does.
"""

import forkv
import pytest
from conftest import load_tiny, scoped_engine

B = 256
SYSTEM = "You are a careful code reviewer. Point out bugs first, style last. " * 3
CODE = "".join(f"def add_{i}(a, b):\n    return a - b  # should add {i}\n" for i in range(14))
ARCHS = ["gemma3", "qwen3_5"]


def common_prefix(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class Checked:
    """Runs nodes one at a time and checks each against the bound, from its stats."""

    def __init__(self, session):
        self.session = session
        self.history = []  # token sequences the engine has computed (and so checkpointed)
        self.prompts = []  # the prompts among them (prefilled, so their turn ends recorded)

    def run(self, node):
        prompt = self.session.prompt(node).token_ids
        (done,) = self.session.run(node)
        st = done.result.stats
        lcp = max((common_prefix(prompt, h) for h in self.history), default=0)
        reusable = min(lcp, len(prompt) - 1) // B * B  # the last block boundary of the prefix
        # ... or a turn end after it (turns.py) that an earlier prompt went through
        turns = self.session.engine.checkpointer.turns
        ends = [e for e in turns.ends(prompt) if e // B * B == reusable and e < len(prompt)
                and any(common_prefix(prompt, p) >= e for p in self.prompts)] if turns else []
        reusable = max(ends, default=reusable)
        assert st.tokens_reused + st.tokens_computed == len(prompt)
        # (lcp - reusable) tokens after the boundary + (len(prompt) - lcp) new tokens
        assert st.tokens_computed <= (lcp - reusable) + (len(prompt) - lcp), done.id
        assert st.tokens_reused == reusable, done.id  # every checkpoint on the prefix is used
        # the last generated token is never fed back, so it is not in any checkpoint
        self.history.append(prompt + done.result.token_ids[:-1])
        self.prompts.append(prompt)
        return done


def from_scratch(lm, path):
    """Run `path` (given nodes, then one generated node) in a fresh session, no checkpoints."""
    with forkv.Session(scoped_engine(lm, checkpoints=False)) as s:
        parent = None
        for n in path[:-1]:
            parent = s.tree.add(parent, n.kind, n.text)
        target = s.tree.add(parent, path[-1].kind, gen=path[-1].gen)
        (done,) = s.run(target)
        assert done.result.stats.tokens_reused == 0
        return done.result


@pytest.mark.parametrize("arch", ARCHS)
def test_branch_prune_and_rewind_compute_only_past_the_last_boundary(arch):
    lm = load_tiny(arch)
    with forkv.Session(lm) as s:
        c = Checked(s)
        u = s.system(SYSTEM).user("Review this module:\n\n" + CODE)
        assert s.prompt(u).num_tokens > 3 * B  # the prompt spans several blocks
        r = c.run(u.reasoning({"max_tokens": 320}))
        f = c.run(r.final({"max_tokens": 24}))

        # prune: system -> user -> final (verbatim), then a follow-up
        kept = s.tree.prune(f)
        assert kept.text == f.text and kept.parent_id == u.id
        q1 = c.run(kept.user("Now review the tests as well.").final({"max_tokens": 24}))
        assert q1.result.stats.tokens_reused >= 3 * B
        ref = from_scratch(lm, q1.path())
        assert q1.result.token_ids == ref.token_ids and q1.text == ref.text

        # rewind to the pruned final: another follow-up
        q2 = c.run(kept.user("What about naming?").final({"max_tokens": 24}))
        ref = from_scratch(lm, q2.path())
        assert q2.result.token_ids == ref.token_ids and q2.text == ref.text

        # rewind to the user turn: thinking again (greedy) reproduces the first reasoning
        r2 = c.run(u.reasoning({"max_tokens": 320}))
        assert r2.result.token_ids == r.result.token_ids and r2.text == r.text
        assert r2.result.stats.tokens_computed < B

        # rewind deeper into a pruned branch: continue after the first follow-up
        q3 = c.run(q1.user("Summarise.").final({"max_tokens": 16}))
        ref = from_scratch(lm, q3.path())
        assert q3.result.token_ids == ref.token_ids


@pytest.mark.parametrize("arch", ARCHS)
def test_fork_computes_the_shared_prefix_once(arch):
    with forkv.Session(load_tiny(arch)) as s:
        u = s.system(SYSTEM).user("Review this module:\n\n" + CODE)
        branches = u.fork(4, gen={"temperature": 0.8, "max_tokens": 12})
        s.run(branches)
        prompt = branches[0].result.timings["prompt_tokens"]
        stats = [b.result.stats for b in branches]
        assert stats[0].tokens_reused == 0 and stats[0].tokens_computed == prompt
        # every full block of the shared prompt is restored, and its turn end past them
        end = s.engine.checkpointer.turns.ends(s.prompt(branches[1]).token_ids[:-1])[-1]
        assert end > (prompt - 1) // B * B >= 3 * B
        for st in stats[1:]:
            assert st.tokens_reused == end
            assert st.tokens_computed == prompt - end < 8
        assert len({tuple(b.result.token_ids) for b in branches}) > 1  # seeds differ
