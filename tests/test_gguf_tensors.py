"""GGUF tensor types: every type forkv converts dequantizes exactly as gguf-py's reference
does (and close to the original where gguf-py can quantize); bfloat16 storage rounds like mlx."""

import mlx.core as mx
import numpy as np
import pytest
from forkv.engine.models.gguf import GGUFError, read_gguf_header
from forkv.engine.models.gguf.tensors import SUPPORTED_TYPES, dequantize, to_storage

QUANTIZABLE = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q5_0": 0.07, "Q5_1": 0.07,
               "Q4_0": 0.15, "Q4_1": 0.15}
SHAPE = (3, 512)  # rows of 512: whole blocks for every type (K-quants use 256)


def _raw(qtype: str, rng):
    """(original float32 or None, the bytes gguf-py holds for it, reference float32)."""
    import gguf
    from gguf.quants import dequantize as ref
    from gguf.quants import quantize

    qt = gguf.GGMLQuantizationType[qtype]
    if qtype in QUANTIZABLE:
        w = rng.standard_normal(SHAPE).astype(np.float32)
        data = quantize(w, qt)
    else:  # no reference quantizer for K-quants: random blocks, compared with the reference
        w = None
        block, size = gguf.GGML_QUANT_SIZES[qt]
        data = rng.integers(0, 256, (SHAPE[0], SHAPE[1] // block * size), dtype=np.uint8)
    expect = ref(data, qt).astype(np.float32).reshape(SHAPE)
    return w, data, expect


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random K-quant blocks decode to inf/nan
def test_every_supported_type_matches_the_reference(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    path = tmp_path / "types.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    cases = {}
    for qtype in SUPPORTED_TYPES:
        w, data, expect = _raw(qtype, rng)
        cases[qtype] = (w, expect)
        qt = gguf.GGMLQuantizationType[qtype]
        raw_dtype = None if data.dtype in (np.float32, np.float16) else qt
        writer.add_tensor(f"{qtype}.weight", data, raw_dtype=raw_dtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    header = read_gguf_header(path)
    for qtype, (w, expect) in cases.items():
        info = header.tensors[f"{qtype}.weight"]
        assert info.type_name == qtype and info.shape == SHAPE
        got = dequantize(header, info)
        assert got.dtype == np.float32 and got.shape == SHAPE
        np.testing.assert_array_equal(got, expect, err_msg=qtype)
        if w is not None:
            assert np.abs(got - w).max() <= QUANTIZABLE[qtype] * np.abs(w).max() + 1e-7, qtype


def test_chunked_dequantization_matches_one_shot(tmp_path, monkeypatch):
    import gguf
    from forkv.engine.models.gguf import tensors

    monkeypatch.setattr(tensors, "_CHUNK_ELEMENTS", 256 * 3)  # several uneven chunks
    rng = np.random.default_rng(1)
    _, data, expect = _raw("Q6_K", rng)
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("q.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    header = read_gguf_header(path)
    np.testing.assert_array_equal(dequantize(header, header.tensors["q.weight"]), expect)


def test_unsupported_type_names_tensor_and_type(tmp_path):
    import gguf

    path = tmp_path / "i.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("idx.weight", np.arange(8, dtype=np.int32))
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    header = read_gguf_header(path)
    with pytest.raises(GGUFError, match=r"'idx.weight' has type I32"):
        dequantize(header, header.tensors["idx.weight"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 3.4e38 overflows float16 on purpose
def test_bfloat16_storage_rounds_like_mlx():
    rng = np.random.default_rng(2)
    a = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 10,
                        np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.4e38, np.nan],
                                 np.float32)])
    ours = to_storage(a, "bfloat16")
    theirs = np.array(mx.array(a).astype(mx.bfloat16).view(mx.uint16))
    finite = ~np.isnan(a)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(np.array(mx.array(ours).view(mx.bfloat16).astype(mx.float32))[~finite]).all()
    np.testing.assert_array_equal(to_storage(a, "float16"), a.astype(np.float16))
