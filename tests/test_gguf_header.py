"""GGUF header: a valid file reads back exactly; any truncated, mutated or random file is one
GGUFError line (or a valid header), read once, with work and memory in proportion to the file:
never a hang or a huge allocation."""

import io
import struct
import tracemalloc
from unittest import mock

import numpy as np
import pytest
from forkv.engine.errors import ModelLoadError
from forkv.engine.models.gguf import GGUFError, is_gguf_file, read_gguf_header, read_gguf_metadata
from forkv.engine.models.gguf import header as gguf_header
from forkv.engine.models.gguf.header import _Parser, read_tensor_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _small_gguf(path, alignment=None):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_array("tokenizer.ggml.tokens", ["a", "b\u00e9", "", "<0x0A>"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.0, 3.0])
    w.add_array("general.tags", [[1, 2], [3]])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b.weight", np.ones(5, np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    return _small_gguf(tmp_path_factory.mktemp("gguf") / "small.gguf").read_bytes()


def test_valid_file_reads_back(tmp_path):
    path = _small_gguf(tmp_path / "m.gguf", alignment=64)
    assert is_gguf_file(path) and not is_gguf_file(tmp_path) and not is_gguf_file(tmp_path / "x")
    header = read_gguf_header(path)
    md = header.metadata
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 2
    assert md["tokenizer.ggml.tokens"] == ["a", "b\u00e9", "", "<0x0A>"]
    assert md["tokenizer.ggml.scores"] == [0.0, -1.5, 2.0, 3.0]
    assert md["general.tags"] == [[1, 2], [3]] and md["tokenizer.ggml.add_bos_token"] is True
    assert header.alignment == 64 and header.data_offset % 64 == 0
    a, b = header.tensors["a.weight"], header.tensors["b.weight"]
    assert (a.shape, a.type_name, a.nbytes) == ((3, 4), "F32", 48)
    assert (b.shape, b.type_name, b.nbytes) == ((5,), "F16", 10)
    data = np.frombuffer(read_tensor_bytes(header, a), np.float32)
    np.testing.assert_array_equal(data, np.arange(12))
    assert read_gguf_metadata(path) == md


class _Counting(io.FileIO):
    """The file the parser reads, counting the bytes it hands out."""

    num_read = 0

    def read(self, n=-1):
        data = super().read(n)
        _Counting.num_read += len(data)
        return data


def _check(path):
    """Reading `path` either succeeds or is one GGUFError line naming the file; either way
    the reader reads each byte at most once, does work in proportion to the file (no hang)
    and allocates in proportion to it (never by a count the file only claims)."""
    size = path.stat().st_size
    real_need, num_needs = _Parser.need, []

    def need(parser, n, what):
        num_needs.append(n)
        return real_need(parser, n, what)

    _Counting.num_read = 0
    with mock.patch.object(gguf_header, "open", lambda p, mode: _Counting(p, "r"), create=True), \
            mock.patch.object(_Parser, "need", need):
        tracemalloc.start()
        try:
            read_gguf_header(path)
        except GGUFError as e:
            assert isinstance(e, ModelLoadError)
            assert str(path) in str(e) and "\n" not in str(e)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    assert _Counting.num_read <= size
    assert len(num_needs) <= size // 2 + 8  # each step takes 4+ bytes, or follows one that did
    assert peak < (64 << 10) + 64 * size  # Python objects for what was read, no more


def test_every_truncation_is_one_line(tmp_path, valid):
    path = tmp_path / "t.gguf"
    path.write_bytes(valid)
    end = max(t.offset + t.nbytes for t in read_gguf_header(path).tensors.values())
    for n in range(end):  # past `end` only the writer's trailing padding is cut
        path.write_bytes(valid[:n])
        with pytest.raises(GGUFError) as e:
            read_gguf_header(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("offset,value,problem", [
    (0, b"GGML", "magic"),
    (4, struct.pack("<I", 1), "version 1"),
    (4, struct.pack(">I", 3), "big-endian"),
    (8, struct.pack("<Q", 1 << 60), "tensor count"),
    (16, struct.pack("<Q", 1 << 60), "metadata count"),
    (24, struct.pack("<Q", 1 << 62), "claims"),  # the first key's length
])
def test_hostile_counts_are_refused_before_allocating(tmp_path, valid, offset, value, problem):
    path = tmp_path / "m.gguf"
    data = bytearray(valid)
    data[offset:offset + len(value)] = value
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=problem):
        read_gguf_header(path)


def _patch(valid, old: bytes, new: bytes) -> bytes:
    assert valid.count(old) >= 1
    return valid.replace(old, new, 1)


def test_huge_array_count_is_refused(tmp_path, valid):
    key = b"tokenizer.ggml.tokens"
    at = valid.index(key) + len(key) + 8  # value type (4) + item type (4)
    data = valid[:at] + struct.pack("<Q", 1 << 61) + valid[at + 8:]
    (tmp_path / "m.gguf").write_bytes(data)
    with pytest.raises(GGUFError, match="claims"):
        read_gguf_header(tmp_path / "m.gguf")


def _tensor_info_at(valid, name: bytes) -> int:
    return valid.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)


@pytest.mark.parametrize("field,value,problem", [
    ("rank", struct.pack("<I", 5), "dimensions"),
    ("dim", struct.pack("<Q", 0), "shape"),
    ("type", struct.pack("<I", 99), "unknown ggml type 99"),
    ("offset", struct.pack("<Q", 32), "overlaps"),
    ("offset", struct.pack("<Q", 3), "aligned"),
    ("offset", struct.pack("<Q", 1 << 40), "outside the file"),
])
def test_bad_tensor_info_is_named(tmp_path, valid, field, value, problem):
    at = _tensor_info_at(valid, b"b.weight")  # rank u32, dims u64 x1, type u32, offset u64
    where = {"rank": at, "dim": at + 4, "type": at + 12, "offset": at + 16}[field]
    data = valid[:where] + value + valid[where + len(value):]
    (tmp_path / "m.gguf").write_bytes(data)
    with pytest.raises(GGUFError, match=problem) as e:
        read_gguf_header(tmp_path / "m.gguf")
    assert "b.weight" in str(e.value) or field == "offset"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert not is_gguf_file(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        read_gguf_header(fifo)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_headers(tmp_path, valid, data):
    raw = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(raw))
    _check(path)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=512), version=st.sampled_from([2, 3]),
       counts=st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)))
def test_fuzz_random_bodies(tmp_path, body, version, counts):
    path = tmp_path / "rand.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, *counts) + body)
    _check(path)
