import pytest

from conftest import load_tiny
from forkv.engine import ModelLoadError, UnknownDemoModel, load_model
from forkv.engine.models.loader import fingerprint, resolve_model_path


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


# -- quantized weights ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def q4_folder(tmp_path_factory):
    from forkv.convert_cmd import convert_model

    out, _ = convert_model("demo:gemma3:tiny", tmp_path_factory.mktemp("q") / "q4", q_bits=4)
    return out


def _logits(lm, tokens=(1, 5, 9, 30, 2, 7)):
    import mlx.core as mx

    return lm.model(mx.array([list(tokens)]))[0]


@pytest.fixture
def no_native(monkeypatch):
    """forkv's CPU kernels off (FORKV_NATIVE=off), as on a machine that cannot build them."""
    from forkv.engine import native

    monkeypatch.setenv("FORKV_NATIVE", "off")
    monkeypatch.setattr(native, "_info", None)
    monkeypatch.setattr(native, "_module", None)


def test_quantized_auto_runs_on_the_native_kernels_on_the_cpu(q4_folder):
    import mlx.core as mx

    from forkv.engine import native
    from forkv.engine.native.layers import NativeQuantizedLinear

    if native.load() is None:
        pytest.skip(f"forkv's kernels are not available: {native.status().reason}")
    auto = load_model(str(q4_folder))
    assert auto.quantization == f"4-bit on {native.kernel_label()}", auto.quantization
    assert "on forkv's CPU kernels" in auto.quantization_reason
    assert any(isinstance(m, NativeQuantizedLinear) for _, m in auto.model.named_modules())
    deq = load_model(str(q4_folder), quantized="dequantize")
    assert deq.fingerprint != auto.fingerprint
    # int8 activations: close, not equal. Four random layers amplify the rounding (one matmul
    # is within 1.5% of the largest output); the perplexity bench bounds it on real models.
    a, b = _logits(auto), _logits(deq)
    assert float(mx.abs(a - b).max()) <= 0.25 * float(mx.abs(b).max())


def test_quantized_auto_dequantizes_on_the_cpu(q4_folder, no_native):
    import mlx.nn as nn

    auto = load_model(str(q4_folder))
    assert auto.quantization == "4-bit dequantized to float32" and auto.dtype == "float32"
    assert "FORKV_NATIVE=off" in auto.quantization_reason
    assert "mlx's CPU quantized matmul is far slower" in auto.quantization_reason
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in auto.model.named_modules())
    forced = load_model(str(q4_folder), quantized="dequantize")
    assert forced.fingerprint == auto.fingerprint  # same compute, same keys


def test_quantized_keep_computes_the_same_but_keys_differ(q4_folder, no_native):
    import mlx.core as mx
    import mlx.nn as nn

    kept = load_model(str(q4_folder), quantized="keep")
    deq = load_model(str(q4_folder), quantized="dequantize")
    assert kept.quantization == "4-bit kept" and "FORKV_NATIVE=off" in kept.quantization_reason
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in kept.model.named_modules())
    assert kept.fingerprint != deq.fingerprint
    a, b = _logits(kept), _logits(deq)
    assert mx.allclose(a, b, atol=1e-4, rtol=1e-4), float(mx.abs(a - b).max())


def test_quantized_auto_keeps_what_would_not_fit(q4_folder, monkeypatch, no_native):
    from forkv.engine.models import quantized

    monkeypatch.setattr(quantized, "available_memory", lambda: 1024)
    lm = load_model(str(q4_folder))
    assert lm.quantization == "4-bit kept" and "would not fit" in lm.quantization_reason


def test_unquantized_models_say_none_and_name_their_kernels():
    """A float32 model on the CPU runs attention, norms, RoPE and activations on forkv's
    kernels when they are built: its fingerprint names them (records made under mlx's own
    kernels miss), and a bfloat16 load, which the kernels do not run, does not."""
    from forkv.engine import native
    from forkv.engine.models import blas

    lm = load_tiny("qwen3")
    assert lm.quantization == "none" and "demo model qwen3:tiny" in lm.source
    kernels = "+".join(p for p in (blas.kernel_label(), native.kernel_label()) if p)
    assert fingerprint(lm.path, lm.config, "float32", "none", kernels) == lm.fingerprint
    assert (lm.kernels is not None) == native.status().available
    if native.status().available:
        assert "attention layers" in lm.quantization_reason
        assert fingerprint(lm.path, lm.config, "float32", "none",
                           blas.kernel_label()) != lm.fingerprint
    half = load_tiny("qwen3", "bfloat16")
    assert half.kernels is None
    assert fingerprint(half.path, half.config, "bfloat16", "none",
                       blas.kernel_label()) == half.fingerprint


def test_the_blas_thread_policy_is_part_of_the_fingerprint():
    """OpenBLAS's result for a shape can depend on its thread count: records made under one
    one-thread threshold never restore under another."""
    from forkv.engine.models import blas, blas_threads

    lm = load_tiny("qwen3")
    if not blas.kernel_label():
        pytest.skip("no scipy-openblas shim here: forkv sets no thread counts")
    assert str(blas_threads.active_split_mnk) in blas.kernel_label()
    assert fingerprint(lm.path, lm.config, "float32", "none",
                       "openblas-one-thread-below-0") != lm.fingerprint


def test_bad_quantized_mode():
    from forkv.engine import EngineConfig, EngineConfigError

    with pytest.raises(ModelLoadError, match="Unknown quantized mode"):
        load_model("demo:qwen3:tiny", quantized="int4")
    assert EngineConfig.from_env({"FORKV_QUANTIZED": "keep"}).quantized == "keep"
    with pytest.raises(EngineConfigError, match="FORKV_QUANTIZED"):
        EngineConfig.from_env({"FORKV_QUANTIZED": "sometimes"})


def test_doctor_says_what_it_chose_for_quantized_weights(q4_folder, monkeypatch, no_native):
    from forkv.doctor import report

    info = report(str(q4_folder))
    assert info["quantized"].startswith("auto: dequantize on this CPU")
    assert info["quantization"] == "4-bit dequantized to float32"
    assert "far slower than float BLAS" in info["quant_reason"] and "model folder" in info["source"]
    monkeypatch.setenv("FORKV_QUANTIZED", "keep")
    info = report(str(q4_folder))
    assert info["quantized"] == "keep (FORKV_QUANTIZED)" and info["quantization"] == "4-bit kept"


def test_the_bpe_word_cache_is_bounded():
    # tokenizers caches up to 10,000 words per thread per BPE tokenizer and never empties it:
    # a server's threads filled theirs with words seen once. forkv holds it to 256.
    import random
    import threading

    from forkv import arenas
    from forkv.engine.models.loader import BPE_CACHE_WORDS, bound_word_cache

    if arenas.usage() is None:
        pytest.skip("needs glibc's malloc statistics")
    lm = load_model("demo:qwen3:tiny")
    raw = lm.tokenizer._tokenizer._tokenizer
    rng = random.Random(5)
    # (the demo tokenizer splits no words: each short text is one cache entry)
    texts = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(24))
             for _ in range(12_000)]

    def grown_mib() -> float:  # in a thread of its own: a cache of its own, freed at its end
        out = []

        def run():
            before = arenas.usage()["malloc_in_use"]
            for text in texts:
                raw.encode(text, add_special_tokens=False)
            out.append((arenas.usage()["malloc_in_use"] - before) / 2**20)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return out[0]

    assert grown_mib() < 2.5  # as loaded: 256 entries (~0.3 MiB here)
    bound_word_cache(lm.tokenizer, 10_000)  # tokenizers' default
    try:
        assert grown_mib() > 5  # ~9 MiB here
    finally:
        bound_word_cache(lm.tokenizer, BPE_CACHE_WORDS)
