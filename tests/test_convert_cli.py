"""`forkv convert SRC OUT`: a plain MLX folder that mlx-lm loads, copied or quantized."""

import json

import pytest

from forkv.cli import main


def _load_with_mlx_lm(folder):
    import mlx.core as mx
    from mlx_lm.utils import load

    model, tokenizer = load(str(folder))
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape[-1] >= len(tokenizer.vocab) - 64 and bool(mx.isfinite(logits).all())
    return model


def test_convert_copies_a_demo_model(tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["convert", "demo:qwen3:tiny", str(out)]) == 0
    assert "copied from demo model qwen3:tiny" in capsys.readouterr().err
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    _load_with_mlx_lm(out)


def test_convert_quantizes_to_4_bits(tmp_path, capsys):
    import mlx.nn as nn

    out = tmp_path / "q4"
    assert main(["convert", "demo:gemma3:tiny", str(out), "--q-bits", "4"]) == 0
    assert "quantized to 4-bit (group size 64)" in capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    model = _load_with_mlx_lm(out)
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    again = tmp_path / "f16"  # a quantized source is dequantized first
    assert main(["convert", str(out), str(again), "--dtype", "float16"]) == 0
    assert "quantization" not in json.loads((again / "config.json").read_text())
    _load_with_mlx_lm(again)


def test_convert_refuses_a_non_empty_out(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["convert", "demo:qwen3:tiny", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forkv: error:") and "already exists and is not empty" in err
    assert "\n" not in err and (tmp_path / "out" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()  # an empty OUT is fine
    assert main(["convert", "demo:qwen3:tiny", str(tmp_path / "empty")]) == 0


def test_convert_an_unknown_name(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bits", ["7", "x"])
def test_convert_rejects_bad_bits(tmp_path, bits):
    with pytest.raises(SystemExit):
        main(["convert", "demo:qwen3:tiny", str(tmp_path / "o"), "--q-bits", bits])
