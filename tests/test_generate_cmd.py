"""`forkv generate` (generate_cmd.py): the text on stdout ends in exactly one newline (so
`forkv generate ... > file` is a proper text file), the timings go to stderr, and the default
model is one constant."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import forkv
from forkv.cli import build_parser, main
from forkv.engine import SamplingParams, Timings
from forkv.generate_cmd import DEFAULT_MODEL


class _FakeEngine:
    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def stream(self, prompt, params, progress=None):
        for i, text in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            yield SimpleNamespace(text=text, timings=Timings(prompt_tokens=3),
                                  finish_reason="stop" if last else None)

    def close(self):
        pass


@pytest.mark.parametrize("pieces, stdout", [
    (["Paris", " is", " nice."], "Paris is nice.\n"),
    (["two lines\n", "and a newline\n"], "two lines\nand a newline\n"),  # not a second one
    (["a blank line after\n\n"], "a blank line after\n\n"),  # the model's own text stays
    ([""], "\n"),  # an empty completion is one empty line
])
def test_the_text_ends_in_exactly_one_newline(monkeypatch, capsys, pieces, stdout):
    monkeypatch.setattr(forkv, "load", lambda *a, **k: _FakeEngine(pieces))
    assert main(["generate", "x", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert out.out == stdout
    assert out.err.startswith("[stop] prompt 3 tok") and out.err.count("\n") == 1


def test_a_real_generation_to_a_file_is_its_text_and_one_newline(capsys):
    model = "demo:qwen3:tiny"
    engine = forkv.load(model)
    try:
        want = engine.generate("Hello", SamplingParams(max_tokens=6, temperature=0.0)).text
    finally:
        engine.close()
    assert main(["generate", "Hello", "--model", model, "--max-tokens", "6",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out == want + ("" if want.endswith("\n") else "\n")


def test_the_default_model_is_the_constant():
    args = build_parser().parse_args(["generate", "x"])
    assert args.model == DEFAULT_MODEL
