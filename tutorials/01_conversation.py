"""Tutorial 1: build a conversation tree, then run it.

What it shows:
- building a tree (system -> user -> final) computes nothing: generated nodes wait as `pending`;
- `session.run()` computes every pending node and attaches text, tokens and per-node stats;
- `session.stream(node)` yields the tokens of a node as they come;
- a second turn restores the first turn's prompt from block checkpoints (256 tokens a block)
  instead of computing it again;
- `forkv.graph.to_mermaid(tree)` draws the tree.

Run:  python tutorials/01_conversation.py [MODEL]     (default: demo:qwen3:tiny)
Real text: python tutorials/01_conversation.py smollm2-135m     (a real chat model, fetched once)
The demo models have random weights, so their text is noise; the token counts are real.
"""

import sys

import forkv


def stats(node) -> str:
    s = node.result.stats
    return (f"{node.id}: reused {s.tokens_reused}, computed {s.tokens_computed}, "
            f"generated {s.tokens_generated} tokens")


def main(model: str) -> None:
    with forkv.Session(model) as session:
        # 1. Build: nothing runs yet.
        system = session.system("You are a concise assistant who explains systems ideas.")
        question = system.user("What is a KV cache, and why does it grow with the context? "
                               "Explain it to a new engineer on the team, with an example. " * 3)
        answer = question.final({"max_tokens": 24})
        print(f"built {len(session.tree)} nodes; {answer.id} is {answer.status}")

        # 2. Run: every pending node, in dependency order.
        session.run()
        print("turn 1 ->", stats(answer))

        # 3. Continue the conversation and stream the new answer token by token.
        follow = answer.user("And why would you checkpoint it in blocks?")
        answer2 = follow.final({"max_tokens": 24, "temperature": 0.8, "seed": 1})
        print("turn 2 streaming: ", end="")
        for event in session.stream(answer2):
            print(event.text.encode("ascii", "replace").decode(), end="", flush=True)
        print()
        print("turn 2 ->", stats(answer2))
        assert answer2.result.stats.tokens_reused > 0  # turn 1's blocks were restored

        print(forkv.graph.to_mermaid(session.tree))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo:qwen3:tiny")
