"""tokenizer_load: mlx-lm's tokenizer load with tokenizer.json's decoder section read alone."""

import json

import pytest
from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

from forkv.engine.models.named import NAMED_MODELS
from forkv.engine.models.sources import resolve_source
from forkv.engine.models.tokenizer_load import decoder_section, load_tokenizer

DECODER = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}


@pytest.mark.parametrize("indent", [None, 2])
def test_the_decoder_is_read_without_the_vocabulary(tmp_path, indent):
    path = tmp_path / "tokenizer.json"
    doc = {"version": "1.0", "added_tokens": [{"id": 0, "content": '"decoder": {'}],
           "normalizer": None, "decoder": DECODER,
           "model": {"type": "BPE", "vocab": {"decoder": 1}}}
    path.write_text(json.dumps(doc, indent=indent))
    assert decoder_section(path) == {"decoder": DECODER}
    doc["decoder"] = None
    path.write_text(json.dumps(doc, indent=indent))
    assert decoder_section(path) == {"decoder": None}
    del doc["decoder"], doc["model"]
    path.write_text(json.dumps(doc, indent=indent))
    assert decoder_section(path) == {}  # none at all: mlx-lm's naive detokenizer, as before


def test_files_it_cannot_walk_are_left_to_a_whole_parse(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": {}}, "decoder": DECODER}))
    assert decoder_section(path) is None  # the vocabulary first: not decoded here
    for text in ("[1, 2]", '{"decoder": ', "not json"):
        path.write_text(text)
        assert decoder_section(path) is None


def _folders():
    out = ["demo:qwen3:tiny", "demo:gemma3:tiny"]
    out += [n for n in ("smollm2-135m",) if NAMED_MODELS[n].is_local()]
    # (Gemma 3's 262K-word tokenizer parsed twice: ~9 s, the fast suite's slowest test)
    out += [pytest.param(n, marks=pytest.mark.slow) for n in ("gemma3-270m",)
            if NAMED_MODELS[n].is_local()]
    return out


@pytest.mark.parametrize("name", _folders())
def test_the_tokenizer_is_mlx_lms_own(name):
    path = resolve_source(name).path
    ours, theirs = load_tokenizer(path), mlx_lm_load_tokenizer(path)
    assert type(ours._detokenizer) is type(theirs._detokenizer)
    assert ours.eos_token_ids == theirs.eos_token_ids
    text = "Hello, world! Ça va? 東京 <start_of_turn> \n\n  x"
    assert ours.encode(text) == theirs.encode(text)
    chat = [{"role": "user", "content": "Hi"}]
    assert (ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    import mlx_lm.tokenizer_utils as tu

    assert tu.json is json  # restored
