"""Tutorial 2: the branch-and-prune code-review agent (what `forkv demo` runs).

The agent prefills a system prompt and a long user turn (a module to review, several 256-token
blocks), reasons at length, answers, then *prunes* its reasoning: the conversation continues
as system -> user -> answer, with the answer kept verbatim, and the thinking gone. On sliding-
window and hybrid models the cache cannot be trimmed back to the user turn, so without
checkpoints every prune costs a full prefill. forkv restores the shared prefix up to the last
block boundary or, past it, the end of the last prompt it shares (a turn end: right after the
chat template's generation prompt) and computes only the rest. Each step prints tokens reused
vs computed.

Run:  python tutorials/02_branch_and_prune.py [MODEL]     (default: demo:gemma3:tiny)
"""

import sys

import forkv

SYSTEM = ("You are a careful senior engineer doing code review. Point out bugs first, then "
          "risky edge cases, then style. Quote the lines you mean. Keep the final answer short.")
CODE = "".join(
    f"def scale_{i}(values, factor={i}):\n"
    f"    out = []\n"
    f"    for v in values:\n"
    f"        out.append(v * factor - {i})  # should not subtract\n"
    f"    return out\n\n"
    for i in range(8)
)


def report(step: str, node) -> None:
    s = node.result.stats
    prompt = s.tokens_reused + s.tokens_computed
    print(f"{step:<32} prompt {prompt:>5}  reused {s.tokens_reused:>5}  "
          f"computed {s.tokens_computed:>5}  generated {s.tokens_generated:>4}")


def main(model: str) -> None:
    with forkv.Session(model) as session:
        user = session.system(SYSTEM).user("Review this module:\n\n" + CODE)

        # 1. Think at length, then answer. (Random weights often stop early; this seed
        #    thinks for 300+ tokens on the default model.)
        reasoning = user.reasoning({"max_tokens": 320, "temperature": 0.4, "seed": 12})
        answer = reasoning.final({"max_tokens": 48})
        session.run(reasoning)
        report("reasoning", reasoning)
        session.run(answer)
        report("answer after reasoning", answer)

        # 2. Prune: drop the reasoning, keep the answer verbatim, continue with a follow-up.
        kept = session.tree.prune(answer)  # system -> user -> answer' (a copy under `user`)
        assert kept.text == answer.text and kept.parent_id == user.id
        follow = kept.user("Good. Now suggest a test for scale_3.").final({"max_tokens": 48})
        session.run(follow)
        report("follow-up on the pruned path", follow)

        # 3. Rewind: back to the pruned answer, ask something else instead.
        other = kept.user("Which bug is the most severe?").final({"max_tokens": 48})
        session.run(other)
        report("other follow-up (rewind)", other)

        # 4. Rewind to the user turn and think again, differently.
        again = user.reasoning({"max_tokens": 64, "temperature": 0.7, "seed": 1})
        session.run(again)
        report("second reasoning (rewind)", again)

        # Every prune/rewind computed only what follows the last checkpoint it shares.
        for node in (follow, other, again):
            assert node.result.stats.tokens_reused >= 3 * session.engine.block_size
        print(f"\n{len(session.tree)} nodes; paths:")
        for path in session.tree.paths():
            print("  " + " -> ".join(f"{n.kind}:{n.id}" for n in path))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo:gemma3:tiny")
