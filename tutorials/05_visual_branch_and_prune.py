"""Tutorial 5: visual branch-and-prune — reason about an image, prune the reasoning, ask again.

A vision agent looks at a photo, reasons, answers, then prunes its reasoning and keeps asking
about the same photo: a follow-up question, a second photo in a later turn, and a rewind to ask
the first question differently. On Gemma's sliding-window layers (and Qwen 3.5's gated-delta
layers) the cache cannot be trimmed back, so without checkpoints every prune re-runs the vision
tower and the whole prefill. forkv restores the last block boundary the new path shares —
inside or right after the image — takes the image's remaining tokens from the vision-feature
cache, and computes only the rest. Each step prints tokens reused vs computed, and the vision
tower runs once per distinct image.

Run:  python tutorials/05_visual_branch_and_prune.py [MODEL]     (default: demo:gemma3_vl:tiny)
"""

import io
import sys

import forkv

SYSTEM = ("You are a careful visual analyst. Describe what you see before you conclude, and "
          "keep the final answer to one or two sentences.")


def photo(seed: int, size=(448, 336)) -> bytes:
    """A photo-like PNG: smooth colour fields with fine grain (random, but reproducible)."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    coarse = (rng.rand(size[1] // 56, size[0] // 56, 3) * 255).astype("uint8")
    field = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), dtype=np.float32)
    pixels = np.clip(field + rng.normal(0, 6, field.shape), 0, 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def report(step: str, node) -> None:
    s = node.result.stats
    prompt = s.tokens_reused + s.tokens_computed
    print(f"{step:<34} prompt {prompt:>5}  reused {s.tokens_reused:>5}  "
          f"computed {s.tokens_computed:>5}  generated {s.tokens_generated:>4}")


def main(model: str) -> None:
    street, harbour = photo(1), photo(2)
    with forkv.Session(model) as session:
        user = session.system(SYSTEM).user(
            "Here is a photo of a street at dusk. What stands out in it, and why?",
            images=[street])

        # 1. Reason about the image, then answer.
        reasoning = user.reasoning({"max_tokens": 160, "temperature": 0.4, "seed": 3})
        answer = reasoning.final({"max_tokens": 32})
        session.run(reasoning)
        report("reasoning about the photo", reasoning)
        session.run(answer)
        report("answer", answer)

        # 2. Prune the reasoning (the answer is kept verbatim) and ask about the same photo.
        kept = session.tree.prune(answer)
        follow = kept.user("Which part of the photo is the brightest?").final({"max_tokens": 32})
        session.run(follow)
        report("follow-up on the pruned path", follow)

        # 3. A later turn brings a second photo: only the new turn and image are computed.
        compare = follow.user("Now compare it with this one of a harbour.",
                              images=[harbour]).final({"max_tokens": 32})
        session.run(compare)
        report("second photo in a later turn", compare)

        # 4. Rewind to the first user turn and ask it differently: the image is reused.
        again = user.reasoning({"max_tokens": 48, "temperature": 0.7, "seed": 1})
        session.run(again)
        report("second reasoning (rewind)", again)

        # Every prune and rewind restored at least the block boundaries of the first turn
        # (system, user text and the image), whatever followed it.
        block = session.engine.block_size
        first_turn = reasoning.result.stats.tokens_computed  # its whole prompt, computed cold
        for node in (follow, compare, again):
            assert node.result.stats.tokens_reused >= (first_turn - 8) // block * block > 0
        vision = session.engine.vision
        stats = vision.features.stats
        print(f"\nvision tower runs: {stats.tower_runs} (2 photos); feature cache hits: "
              f"{stats.hits}")
        print(f"{len(session.tree)} nodes; paths:")
        for path in session.tree.paths():
            print("  " + " -> ".join(f"{n.kind}:{n.id}" for n in path))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo:gemma3_vl:tiny")
