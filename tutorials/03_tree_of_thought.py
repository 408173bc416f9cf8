"""Tutorial 3: tree of thought - fork k reasoning branches, score them, keep the best, go on.

What it shows:
- `node.fork(k, gen=...)` adds k sibling reasoning nodes that differ only in their seed;
- running them computes the shared prompt once: the first branch prefills it, the others
  restore every full block of it from checkpoints;
- scoring branches from the streamed logprobs (`session.mean_logprob`, a ready-made scorer;
  any deterministic function of a node works);
- `session.remove(node)` drops the losers and releases the checkpoints only they used;
- the best branch continues with a final answer and a follow-up.

Run:  python tutorials/03_tree_of_thought.py [MODEL]     (default: demo:qwen3_5:tiny)
Real text: python tutorials/03_tree_of_thought.py smollm2-135m     (a real chat model, fetched once)
"""

import sys

import forkv

K = 4
PROBLEM = ("A service's p99 latency doubled after a deploy that only changed logging. Here "
           "are the last 24 log lines:\n" + "".join(
               f"2024-05-0{i % 9 + 1}T12:{i:02d}:00 INFO request id={1000 + i} took "
               f"{80 + 7 * i} ms, log buffer flushes={i // 3}\n" for i in range(24)))


def main(model: str) -> None:
    with forkv.Session(model) as session:
        question = session.system("Think step by step, then answer.").user(PROBLEM)
        branches = question.fork(K, gen={"max_tokens": 40, "temperature": 0.9})
        session.run(branches)

        for b in branches:
            s = b.result.stats
            print(f"branch {b.id} (seed {b.gen.seed}): reused {s.tokens_reused:>5}  "
                  f"computed {s.tokens_computed:>5}  mean logprob "
                  f"{session.mean_logprob(b):.3f}")
        first, rest = branches[0].result.stats, [b.result.stats for b in branches[1:]]
        print(f"shared prompt computed once: {first.tokens_computed} tokens for the first "
              f"branch, {max(s.tokens_computed for s in rest)} at most for each other one")

        best = max(branches, key=session.mean_logprob)
        for b in branches:
            if b is not best:
                session.remove(b)
        print(f"kept {best.id}; removed the other {K - 1}")

        answer = best.final({"max_tokens": 32})
        follow = answer.user("How would you confirm that?").final({"max_tokens": 32})
        session.run(follow)  # runs the answer first, then the follow-up
        for n in (answer, follow):
            s = n.result.stats
            print(f"{n.kind} {n.id}: reused {s.tokens_reused:>5}  computed "
                  f"{s.tokens_computed:>5}  generated {s.tokens_generated:>4}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo:qwen3_5:tiny")
