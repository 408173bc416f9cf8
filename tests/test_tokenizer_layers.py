"""hf_tokenizer / raw_tokenizer: each layer of a loaded tokenizer, whichever layer is given."""

from tokenizers import Tokenizer

from forkv.engine import load_model
from forkv.engine.models.tokenizer_layers import hf_tokenizer, raw_tokenizer


def test_each_layer_is_found_from_any_layer_above_it():
    wrapper = load_model("demo:qwen3:tiny").tokenizer
    hf = wrapper._tokenizer
    # (the wrapper forwards attributes: it too "has" backend_tokenizer, and both layers have a
    # `_tokenizer`, so attribute probes cannot tell them apart)
    assert hasattr(wrapper, "backend_tokenizer") and hf is not wrapper
    assert hf_tokenizer(wrapper) is hf and hf_tokenizer(hf) is hf
    raw = raw_tokenizer(wrapper)
    assert isinstance(raw, Tokenizer) and raw is hf.backend_tokenizer
    assert raw_tokenizer(hf) is raw and raw_tokenizer(raw) is raw


def test_a_tokenizer_without_a_tokenizers_backend_has_no_raw_layer():
    class Slow:
        def encode(self, text):
            return [ord(c) for c in text]

    slow = Slow()
    assert hf_tokenizer(slow) is slow
    assert raw_tokenizer(slow) is None
