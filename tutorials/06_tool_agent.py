"""Tutorial 6: a branch-and-prune tool agent - fork 4 tool-using plans, score them, keep one.

The agent gets two tools, plain Python functions: forkv makes their JSON schemas from the
signatures and the chat template writes them into the prompt the way the model's family does
(Gemma's `call:name{...}` here, Qwen's `<tool_call>` JSON on qwen models). Four plans fork from
the task; each makes two tool calls (`tool_choice="required"`: constrained decoding makes even
a random-weight demo model emit valid calls), the tools run, and their results join the tree.
The plans are scored by mean logprob, the best is kept, the other three are removed with the
checkpoints only they used, and the kept plan writes the answer. Every step prints its tokens
reused from checkpoints: each turn restores the prompt the turn before it computed.

Run:  python tutorials/06_tool_agent.py [MODEL]     (default: demo:gemma3:tiny)
"""

import sys
from typing import Annotated, Literal

import forkv
from forkv.agent import fork_agents
from pydantic import Field

DOCS = {"rope": "RoPE rotates query/key pairs by position.", "kv": "The KV cache grows per token."}


def search_docs(topic: Annotated[str, Field(max_length=8)]) -> str:
    """Look a topic up in the team's notes."""
    return DOCS.get(topic.strip().lower(), f"no notes on {topic!r}")


def calculate(op: Literal["add", "mul"], a: Annotated[int, Field(ge=0, le=99)],
              b: Annotated[int, Field(ge=0, le=99)]) -> int:
    """Add or multiply two small numbers."""
    return a + b if op == "add" else a * b


def main(model: str) -> None:
    with forkv.Session(model) as session:
        user = session.system("You are a research assistant. Use the tools.",
                              tools=[search_docs, calculate]).user(
            "How much KV cache do 12 layers of 16 heads need per token, and why does it grow?")

        plans = fork_agents(session, user, 4, max_steps=2, tool_choice="required",
                            gen={"temperature": 0.9, "seed": 11, "max_tokens": 96,
                                 "parallel_tool_calls": False})
        print("the first call, as the model wrote it:", repr(plans[0].steps[0].node.text))
        for i, plan in enumerate(plans):
            for k, step in enumerate(plan.steps):
                call = step.calls[0]
                print(f"plan {i} step {k}: {call.name}({call.arguments}) -> "
                      f"{step.results[0].text!r:.40}  reused {step.tokens_reused:>5}  "
                      f"computed {step.tokens_computed:>4}")

        def score(plan) -> float:
            return sum(session.mean_logprob(s.node) for s in plan.steps) / len(plan.steps)

        best = max(plans, key=score)
        for plan in plans:
            if plan is not best:
                session.remove(plan.steps[0].node)  # the branch and its own checkpoints
        print(f"kept plan {plans.index(best)} (score {score(best):.3f}); removed the other 3")

        answer = best.steps[-1].results[-1].final({"tool_choice": "none", "max_tokens": 24})
        session.run(answer)
        s = answer.result.stats
        print(f"answer: reused {s.tokens_reused}  computed {s.tokens_computed}  "
              f"generated {s.tokens_generated}")
        print(" -> ".join(f"{n.kind}:{n.id}" for n in answer.path()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo:gemma3:tiny")
