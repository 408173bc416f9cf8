"""The random-weights llama GGUF the benches compare forkv and llama-server on
(`forkv.bench.big_gguf`): a tiny one of the same writer loads in forkv and generates finite
tokens, the writer is deterministic, the cached file is made once, privately, and named by
the type it holds; llama-quantize is found beside llama-server or built alone. Slow: the real
~1B file, built (minutes) and loaded on both sides."""

import json
import math
import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from forkv.bench import big_gguf, llamacpp
from forkv.bench.big_gguf import LLAMA_3_2_1B, LlamaShape, make_llama_1b_gguf, write_llama_gguf
from forkv.bench.llamacpp import LlamaServerMissing, llama_quantize_path

TINY = LlamaShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                  context_length=2048)
K_TINY = LlamaShape(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                    context_length=2048)  # rows of 256: K-quants fit


@pytest.fixture(scope="module")
def tokenizer_gguf() -> Path:
    from forkv.engine.models.named import NAMED_MODELS

    try:
        path = NAMED_MODELS["smollm2-135m"].gguf_path(download=False)
    except Exception:  # noqa: BLE001 - any failure to find it locally is a skip
        path = None
    if path is None or not Path(path).is_file():
        pytest.skip("smollm2-135m's GGUF is not on this machine (forkv pull smollm2-135m)")
    return Path(path)


def _generate(path: Path, n: int = 6):
    import forkv
    from forkv import SamplingParams

    engine = forkv.load(str(path))
    try:
        ids = engine.lm.tokenizer.encode("The river runs past the old stone lamp")
        return engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0))
    finally:
        engine.close()


def test_a_tiny_model_of_the_same_writer_loads_and_generates(tmp_path, tokenizer_gguf):
    from forkv.engine.models.gguf import read_gguf_header

    path = write_llama_gguf(tmp_path / "tiny.gguf", TINY, weight_type="Q8_0",
                            tokenizer_gguf=tokenizer_gguf)
    header = read_gguf_header(path)
    meta = header.metadata
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 2 and meta["llama.embedding_length"] == 64
    assert meta["llama.attention.head_count_kv"] == 2
    assert meta["llama.rope.freq_base"] == 500000.0
    assert len(meta["tokenizer.ggml.tokens"]) == 49152
    assert meta["tokenizer.chat_template"] == read_gguf_header(tokenizer_gguf).metadata[
        "tokenizer.chat_template"]
    assert "output.weight" not in header.tensors  # tied, like Llama 3.2 1B
    assert header.tensors["blk.0.attn_q.weight"].type_name == "Q8_0"
    assert header.tensors["blk.0.attn_norm.weight"].type_name == "F32"
    out = _generate(path)
    assert len(out.token_ids) == 6
    assert all(math.isfinite(lp) for lp in out.logprobs)


def test_the_writer_is_deterministic_and_the_1b_shape_is_llama_3_2s(tmp_path, tokenizer_gguf):
    one = tmp_path / "a.gguf"
    two = tmp_path / "b.gguf"
    small = LlamaShape(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64)
    write_llama_gguf(one, small, tokenizer_gguf=tokenizer_gguf, seed=3)
    write_llama_gguf(two, small, tokenizer_gguf=tokenizer_gguf, seed=3)
    assert one.read_bytes() == two.read_bytes()
    write_llama_gguf(two, small, tokenizer_gguf=tokenizer_gguf, seed=4)
    assert one.read_bytes() != two.read_bytes()
    # Llama 3.2 1B: 2048 wide, 16 layers, 32/8 heads of 64, MLP 8192; ~1.07B at this vocab.
    plan = dict(big_gguf._tensor_plan(LLAMA_3_2_1B, 49152))
    assert plan["blk.15.attn_k.weight"] == (512, 2048)
    assert plan["blk.0.ffn_down.weight"] == (2048, 8192)
    assert sum(int(np.prod(s)) for s in plan.values()) == LLAMA_3_2_1B.params(49152)
    assert 1.0e9 < LLAMA_3_2_1B.params(49152) < 1.1e9
    assert 1.2e9 < LLAMA_3_2_1B.params(128256) < 1.3e9  # the real vocabulary's count


def test_the_cached_file_is_made_once_private_and_named_by_its_type(tmp_path, monkeypatch,
                                                                     tokenizer_gguf):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(big_gguf, "_tokenizer_source", lambda download=False: tokenizer_gguf)
    path = make_llama_1b_gguf(quant="Q4_K_M", quantizer="gguf", shape=TINY)
    assert path.parent == tmp_path / "cache" / "bench"
    assert path.name.startswith("llama-h64-l2-Q4_0-")  # the gguf package has no K-quants
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no stage, no F16 left

    def fail(*a, **k):
        raise AssertionError("built again")
    monkeypatch.setattr(big_gguf, "write_llama_gguf", fail)
    assert make_llama_1b_gguf(quant="Q4_K_M", quantizer="gguf", shape=TINY) == path
    with pytest.raises(ValueError, match="unknown quantization"):
        make_llama_1b_gguf(quant="Q3_K_L", quantizer="gguf", shape=TINY)


# -- llama-quantize: where it is found, how it is built ---------------------------------------
@pytest.fixture
def no_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("FORKV_LLAMA_SERVER", "FORKV_LLAMA_QUANTIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    return tmp_path / "cache" / "llamacpp" / llamacpp.LLAMA_CPP_PYTHON / "bin"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_llama_quantize_is_found_beside_llama_server_first(no_tools, tmp_path, monkeypatch):
    with pytest.raises(LlamaServerMissing, match="--build-quantize"):
        llama_quantize_path()
    cached = _executable(no_tools / "llama-quantize")
    assert llama_quantize_path() == cached
    server = _executable(tmp_path / "mine" / "llama-server")
    monkeypatch.setenv("FORKV_LLAMA_SERVER", str(server))
    assert llama_quantize_path() == cached  # nothing beside that server
    beside = _executable(tmp_path / "mine" / "llama-quantize")
    assert llama_quantize_path() == beside
    monkeypatch.setenv("FORKV_LLAMA_QUANTIZE", str(tmp_path / "nope"))
    with pytest.raises(LlamaServerMissing, match="FORKV_LLAMA_QUANTIZE"):
        llama_quantize_path()


def test_llama_quantize_builds_alone_beside_an_existing_server(no_tools, monkeypatch):
    server = _executable(no_tools / "llama-server")
    built = []

    def run(cmd, log, cwd, deadline):  # stand-ins for pip, cmake configure and build
        log.write(b"output\n")
        if "pip" in cmd:
            import tarfile

            src = cwd / "stage" / "llama_cpp_python-x" / "vendor" / "llama.cpp"
            src.mkdir(parents=True)
            with tarfile.open(cwd / "llama_cpp_python-x.tar.gz", "w:gz") as tar:
                tar.add(cwd / "stage" / "llama_cpp_python-x", "llama_cpp_python-x")
        elif "--build" in cmd:
            built.append(cmd[cmd.index("--target") + 1:-1])
            _executable(cwd / "build" / "bin" / "llama-quantize")
    monkeypatch.setattr(llamacpp, "_run_logged", run)
    path = llama_quantize_path(build=True)
    assert built == [["llama-quantize"]]
    assert path == no_tools / "llama-quantize" and os.access(path, os.X_OK)
    assert server.is_file()  # the server stays
    assert not [p for p in no_tools.parent.parent.iterdir() if p.name.startswith(".build-")]


def _user_built(name: str) -> Path | None:
    """A llama.cpp tool built here: the test cache's, PATH's, or the one `.ci/run` (or
    big_gguf) made in the user's forkv cache (the tests run with their own cache); never
    builds."""
    find = llamacpp.llama_quantize_path if name == "llama-quantize" else llamacpp.llama_server_path
    try:
        return find()
    except LlamaServerMissing:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        user = Path(xdg, "forkv", "llamacpp", llamacpp.LLAMA_CPP_PYTHON, "bin", name)
        return user if os.access(user, os.X_OK) else None


def _built_quantize() -> Path:
    binary = _user_built("llama-quantize")
    if binary is None:
        pytest.skip("llama-quantize is not built (python -m forkv.bench.llamacpp "
                    "--build-quantize)")
    return binary


def test_llama_quantize_makes_q4_k_m_that_forkv_runs(tmp_path, tokenizer_gguf):
    from forkv.engine.models.gguf import read_gguf_header

    binary = _built_quantize()
    f16 = write_llama_gguf(tmp_path / "f16.gguf", K_TINY, tokenizer_gguf=tokenizer_gguf)
    out = tmp_path / "q4km.gguf"
    subprocess.run([str(binary), str(f16), str(out), "Q4_K_M", "2"], check=True,
                   capture_output=True, timeout=300)
    types = {t.type_name for t in read_gguf_header(out).tensors.values()}
    assert {"Q4_K", "Q6_K"} <= types
    gen = _generate(out)
    assert all(math.isfinite(lp) for lp in gen.logprobs)


# -- the real file --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_1b_file_builds_and_runs_on_both_sides(tokenizer_gguf, monkeypatch):
    """Builds the real ~1B file into the test cache once (llama-quantize: about 2 minutes on 2
    cores, 0.67 GB), loads it in forkv and, where llama-server is built, there too."""
    from forkv.engine.models.gguf import read_gguf_header

    quantize = _user_built("llama-quantize")
    if quantize is not None:
        monkeypatch.setenv("FORKV_LLAMA_QUANTIZE", str(quantize))
    else:
        pytest.importorskip("gguf.quants", reason="neither llama-quantize nor the gguf "
                                                  "package's quantizers are here")
    path = make_llama_1b_gguf(quantizer="llama" if quantize else "gguf", build=False)
    assert big_gguf.big_model_name(build=False) == str(path)
    header = read_gguf_header(path)
    assert header.metadata["llama.block_count"] == 16
    assert header.metadata["llama.embedding_length"] == 2048
    assert header.tensors["blk.0.ffn_up.weight"].type_name == ("Q4_K" if quantize else "Q4_0")
    gen = _generate(path, 4)
    assert all(math.isfinite(lp) for lp in gen.logprobs)
    binary = _user_built("llama-server")
    if binary is None:
        return
    import urllib.request

    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "4096")  # not the 128K the file allows
    server = llamacpp.start_llama_server(binary, str(path))
    try:
        server.wait_ready(timeout=600)
        body = json.dumps({"prompt": "The river", "n_predict": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/completion", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            assert json.loads(r.read())["tokens_predicted"] == 4
    finally:
        server.stop()
