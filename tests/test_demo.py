import json

import pytest

from forkv.engine.demo.models import ARCHS, demo_config, ensure_demo_model
from forkv.engine.errors import UnknownDemoModel


def test_demo_folder_is_a_normal_model_folder(arch):
    folder = ensure_demo_model(arch, "tiny")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config == demo_config(arch, "tiny")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<think>" in tok_config["chat_template"]


def test_demo_build_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path))
    import shutil

    folder = ensure_demo_model("qwen3", "tiny")
    a = folder.joinpath("model.safetensors").read_bytes()
    shutil.rmtree(folder)
    b = ensure_demo_model("qwen3", "tiny").joinpath("model.safetensors").read_bytes()
    assert a == b


def test_demo_loads_with_mlx_lm(arch):
    from mlx_lm import load

    model, tokenizer = load(str(ensure_demo_model(arch, "tiny")))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>system\ns<|im_end|>" in text
    assert "<think>\nr\n</think>\n\na<|im_end|>" in text


def test_old_reasoning_is_dropped_by_the_template():
    from mlx_lm import load

    _, tokenizer = load(str(ensure_demo_model("qwen3", "tiny")))
    messages = [{"role": "user", "content": "u"},
                {"role": "assistant", "content": "a", "reasoning_content": "r"},
                {"role": "user", "content": "again"}]
    assert "<think>" not in tokenizer.apply_chat_template(messages, tokenize=False)


def test_small_configs_are_shaped_like_real_checkpoints():
    g = demo_config("gemma3", "small")
    assert (g["num_hidden_layers"], g["hidden_size"], g["sliding_window"]) == (18, 640, 512)
    q = demo_config("qwen3_5", "small")["text_config"]
    assert q["full_attention_interval"] == 4 and q["num_hidden_layers"] % 4 == 0
    assert set(ARCHS) >= {"qwen3", "gemma3", "qwen3_5"}


@pytest.mark.parametrize("bad", [("llama9", "tiny"), ("qwen3", "huge")])
def test_unknown_demo_model(bad):
    with pytest.raises(UnknownDemoModel, match="Unknown demo model"):
        demo_config(*bad)
