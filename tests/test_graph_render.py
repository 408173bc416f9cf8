"""Rendering paths with the toy tokenizer: messages, prompts, spans, images, blocks."""

import itertools

import pytest
from forkv.graph import NodeStateError, ReasoningFormat, Tree, block_range, render
from forkv.graph.render import Tokenizer
from forkv.graph.testing import ToyTokenizer

TOK = ToyTokenizer()


def texts(rp):
    return {k: TOK.decode(rp.token_ids[a:b]) for k, (a, b) in rp.spans.items()}


def build():
    t = Tree()
    s = t.system("S")
    u = s.user("Q")
    r = u.reasoning()
    f = r.final()
    return t, s, u, r, f


def test_toy_tokenizer_is_a_tokenizer():
    assert isinstance(TOK, Tokenizer)
    ids = TOK.encode("<|im_start|>hé<think>")
    assert ids[0] == 256 and TOK.decode(ids) == "<|im_start|>hé<think>"


def test_reasoning_prompt():
    t, _s, _u, r, f = build()
    rp = render(t, r, TOK)
    assert rp.is_prompt and rp.node_id == "r3"
    assert rp.prompt_text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert rp.messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert texts(rp) == {
        "s1": "<|im_start|>system\nS<|im_end|>\n",
        "u2": "<|im_start|>user\nQ<|im_end|>\n",
        "r3": "<|im_start|>assistant\n<think>\n",
    }
    assert rp.token_ids == TOK.encode(rp.prompt_text)
    with pytest.raises(NodeStateError, match="node 'r3' above 'f4' has no text yet"):
        render(t, f, TOK)


def test_final_prompt_after_reasoning_and_without():
    t, _s, u, r, f = build()
    t.attach(r, "think")
    rp = render(t, f, TOK)
    assert rp.prompt_text.endswith("<|im_start|>assistant\n<think>\nthink\n</think>\n\n")
    assert texts(rp)["r3"] == "<|im_start|>assistant\n<think>\nthink\n</think>\n\n"
    assert rp.spans["f4"] == (rp.num_tokens, rp.num_tokens)
    g = u.final()
    fmt = ReasoningFormat(empty="<think>\n\n</think>\n\n")
    rp = render(t, g, TOK, fmt)
    assert rp.prompt_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert texts(rp)[g.id] == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_done_path_spans_cover_each_node():
    t, _s, _u, r, f = build()
    t.attach(r, "think")
    t.attach(f, "answer")
    rp = render(t, f, TOK)
    assert not rp.is_prompt
    assert rp.messages[-1] == {
        "role": "assistant",
        "content": "answer",
        "reasoning_content": "think",
    }
    assert texts(rp) == {
        "s1": "<|im_start|>system\nS<|im_end|>\n",
        "u2": "<|im_start|>user\nQ<|im_end|>\n",
        "r3": "<|im_start|>assistant\n<think>\nthink\n</think>\n\n",
        "f4": "answer<|im_end|>\n",
    }
    spans = list(rp.spans.values())
    assert spans[0][0] == 0 and spans[-1][1] == rp.num_tokens
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_reasoning_dropped_by_template():
    t, _s, _u, r, f = build()
    t.attach(r, "secret thoughts")
    t.attach(f, "answer")
    nxt = f.user("more?")
    rp = render(t, nxt.final(), TOK)
    assert "secret thoughts" not in rp.prompt_text
    got = texts(rp)
    assert got["r3"] == "<|im_start|>assistant\n"  # only the header survives
    assert got["f4"] == "answer<|im_end|>\n"
    assert got[nxt.id] == "<|im_start|>user\nmore?<|im_end|>\n"
    kept = render(t, nxt, ToyTokenizer(keep_old_reasoning=True))
    assert "secret thoughts" in kept.prompt_text


def test_tool_and_images():
    t = Tree()
    u = t.user("see", images=[b"\x89PNG\r\n\x1a\nA", b"\x89PNG\r\n\x1a\nB"])
    f = u.final(text="calling")
    tool = f.tool("result", name="search")
    rp = render(t, tool.final(), TOK)
    assert rp.messages[0]["content"][:2] == [{"type": "image"}, {"type": "image"}]
    assert rp.messages[2] == {"role": "tool", "content": "result", "name": "search"}
    pads = [i for i, x in enumerate(rp.token_ids) if x == TOK.image_token_id]
    assert [(i.sha256, i.node_id, i.position) for i in rp.images] == [
        (u.images[0].sha256, "u1", pads[0]),
        (u.images[1].sha256, "u1", pads[1]),
    ]

    tok = ToyTokenizer()
    tok.image_token_id = None  # a tokenizer that does not say which id is the image token
    assert [i.position for i in render(t, u, tok).images] == [None, None]


def test_template_kwargs_and_refusing_templates():
    seen = {}

    class Picky(ToyTokenizer):
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
            seen.update(kw)
            if messages[-1]["role"] == "system":
                raise ValueError("needs a user turn")
            return super().apply_chat_template(messages, tokenize, add_generation_prompt)

    t = Tree()
    u = t.system("S").user("Q")
    rp = render(t, u.final(), Picky(), template_kwargs={"enable_thinking": False})
    assert seen == {"enable_thinking": False}
    assert rp.spans["s1"] == (0, 0)  # the system prefix could not be rendered alone
    assert TOK.decode(rp.token_ids[slice(*rp.spans["u2"])]).startswith("<|im_start|>system")


def test_block_range_and_blocks():
    assert list(block_range((0, 0), 4)) == [] and list(block_range((3, 9), 4)) == [0, 1, 2]
    assert list(block_range((4, 8), 4)) == [1]
    t, _s, _u, r, _f = build()
    rp = render(t, r, TOK)
    blocks = rp.blocks(8)
    assert set(blocks) == {"s1", "u2", "r3"} and blocks["s1"][0] == 0


def test_messages_are_written_on_first_read_as_the_nodes_were_rendered(monkeypatch):
    """A render does not write the path's messages (a deep path has many, and most callers
    never read them); read later, they are the nodes' as rendered, not as edited since."""
    import importlib

    render_module = importlib.import_module("forkv.graph.render")

    t, _s, u, r, _f = build()
    written = []
    real = render_module._snapshot_messages
    monkeypatch.setattr(render_module, "_snapshot_messages",
                        lambda *a: written.append(1) or real(*a))
    rp = render(t, r, TOK)
    assert written == []
    u.text = "edited"
    assert rp.messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert rp.messages is rp.messages and written == [1]
