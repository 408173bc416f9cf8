"""`forkv demo`: the branch-and-prune code-review agent (tutorial 2) on a built-in model.

Prefill system + user, reason at length, answer, prune the reasoning (the answer kept
verbatim), continue with follow-ups and a rewind, printing at each step how many prompt tokens
were restored from checkpoints and how many were computed, with timings. Knows only the
public `forkv` API; the numbers come from each node's statistics. The tree (conversation text
included) is written only where the user asks (`save`), as a 0600 file.
"""

from __future__ import annotations

import time

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


def _step(label: str, node, show_text: bool = False) -> tuple[int, int]:
    st, t = node.result.stats, node.result.timings
    print(f"  {label:<34} reused {st.tokens_reused:>5}  computed {st.tokens_computed:>5}  "
          f"generated {st.tokens_generated:>4}  finish={node.result.finish_reason:<6} "
          f"prefill={t['prefill_tps']:.0f} tok/s  first-token={t['first_token_s'] * 1000:.0f} ms"
          f"  total={t['wall_s']:.2f} s")
    if show_text:  # a real model's words; a demo model's would be noise
        text = " ".join(node.text.split())
        print(f"    {text[:110] + ('…' if len(text) > 110 else '')!s}")
    return st.tokens_reused, st.tokens_computed


def run_demo(model: str = "demo:gemma3:tiny", max_tokens: int = 48,
             reasoning_tokens: int = 320, save: str | None = None) -> int:
    """Run the workflow on `model`; `max_tokens` caps each answer; `save` is a path for the
    tree (mode 0600), else nothing is written. Returns an exit code."""
    import forkv
    from forkv.security import write_private_file

    t0 = time.perf_counter()
    with forkv.Session(model) as session:
        lm = session.engine.lm
        print(f"model {model}: {lm.model_type}, {lm.dtype}, caches: {lm.layout.describe()}, "
              f"block {session.engine.block_size} tokens")
        real = not model.startswith("demo:")
        if real:
            print(f"{lm.source}; each step prints the start of its text.\n")
        else:
            print("random weights: the text is noise (often invalid UTF-8, which re-encodes to "
                  "other tokens, so a prompt that repeats generated text shares fewer tokens "
                  "than with a real model); token counts and timings are real.\n")
        # A small base model (gemma3-270m) loops on the reasoning's "<think>" without a penalty.
        penalty = {"repetition_penalty": 1.3} if real else {}
        answer = {"max_tokens": max_tokens, **penalty}
        user = session.system(SYSTEM).user("Review this module:\n\n" + CODE)
        print(f"1. system + user ({session.prompt(user).num_tokens} tokens), then reason and "
              "answer:")
        # (this seed thinks past 300 tokens on the default model; random weights often stop early)
        reasoning = user.reasoning({"max_tokens": reasoning_tokens, "temperature": 0.4,
                                    "seed": 3, **penalty})
        final = reasoning.final(answer)
        totals = [_step("reasoning", session.run(reasoning)[0], real),
                  _step("final answer (after reasoning)", session.run(final)[0],
                             real)]

        print("2. prune the reasoning, keep the answer verbatim, ask a follow-up:")
        kept = session.tree.prune(final)
        follow = kept.user("Good. Now suggest a test for scale_3.").final(answer)
        totals.append(_step("follow-up on the pruned path", session.run(follow)[0], real))

        print("3. rewind to the pruned answer and ask something else instead:")
        other = kept.user("Which bug is the most severe?").final(answer)
        totals.append(_step("other follow-up (rewind)", session.run(other)[0], real))

        print("4. rewind to the user turn and think again with another seed:")
        again = user.reasoning({"max_tokens": 64, "temperature": 0.7, "seed": 1, **penalty})
        totals.append(_step("second reasoning (rewind)", session.run(again)[0], real))

        reused = sum(r for r, _ in totals)
        computed = sum(c for _, c in totals)
        print(f"\nprompt tokens: {reused + computed} in all, {reused} restored from "
              f"checkpoints, {computed} computed ({reused / max(1, reused + computed):.0%} "
              f"reused); {time.perf_counter() - t0:.1f} s total.")
        if save is None:
            print(f"tree: {len(session.tree)} nodes; `forkv demo --save tree.json` keeps it "
                  "(mode 0600) for `forkv show`.")
        else:
            write_private_file(save, session.tree.to_json(1).encode("utf-8"))
            print(f"tree: {len(session.tree)} nodes, saved to {save} (mode 0600); draw it with "
                  f"`forkv show {save}`.")
    return 0
