import pytest

from conftest import load_tiny
from forkv.engine import ModelLoadError, UnknownDemoModel, load_model
from forkv.engine.loader import fingerprint, resolve_model_path


@pytest.mark.parametrize("name", ["demo:nope", "demo:qwen3:huge", "demo:", "demo:qwen3:tiny:x"])
def test_unknown_demo_names(name):
    with pytest.raises(UnknownDemoModel, match="demo:<arch>"):
        resolve_model_path(name)


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="no .safetensors"):
        load_model(str(tmp_path))


def test_bad_dtype():
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        load_model("demo:qwen3:tiny", dtype="int3")


def test_loads_any_folder_and_fingerprints_dtype(arch):
    lm = load_tiny(arch)
    again = load_model(str(lm.path))
    assert again.fingerprint == lm.fingerprint
    assert fingerprint(lm.path, lm.config, "bfloat16") != lm.fingerprint
    assert lm.context_length > 1000 and lm.eos_token_ids


def test_bfloat16_load():
    import mlx.core as mx

    lm = load_tiny("gemma3", "bfloat16")
    assert lm.dtype == "bfloat16"
    assert lm.model.model.embed_tokens.weight.dtype == mx.bfloat16
