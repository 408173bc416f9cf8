"""Bounded reading of a GGUF file's header: metadata key/values and the tensor-info table.

A GGUF file is untrusted input (llama.cpp's own parser has had memory-safety CVEs), so every
count, length and offset is checked against the bytes that remain before anything is
allocated: a truncated or malformed file is one `GGUFError` line naming the file and the
problem, never a hang, a crash or a huge allocation. Only little-endian GGUF v2 and v3 are read.

This module knows the container format and each ggml type's block size. It does not know what
any metadata key means, how to dequantize a tensor, or how tensors map to a model.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelLoadError

__all__ = ["GGML_TYPES", "GGUFError", "GGUFHeader", "TensorInfo", "is_gguf_file",
           "read_gguf_header", "read_tensor_bytes"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Real headers are a few MiB to a few tens of MiB (a 262K vocabulary is ~10 MiB); the caps only
# stop a hostile file from making the reader allocate without bound.
MAX_HEADER_BYTES = 256 << 20
MAX_METADATA_ITEMS = 1 << 23  # all array elements together: ~30x the largest real vocabulary
MAX_ARRAY_DEPTH = 2  # llama.cpp reads no nested arrays at all; gguf-py writes one level
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME = 63  # llama.cpp rejects names of GGML_MAX_NAME (64) bytes or more
MAX_KEY_BYTES = 1 << 16
_INT64_MAX = (1 << 63) - 1

# ggml type id -> (name, elements per block, bytes per block), as in ggml.h / gguf-py.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# GGUF metadata value types: id -> struct format of a scalar (None: string / array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFError(ModelLoadError):
    """A GGUF file that is truncated, malformed, or uses something forkv cannot convert."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the file. `shape` is numpy order (ggml's `ne` reversed); `offset` is the
    absolute byte offset of its data in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """Everything before the tensor data: validated metadata and tensor table."""

    path: Path
    version: int
    metadata: dict
    tensors: dict[str, TensorInfo]  # in file order
    alignment: int
    data_offset: int
    file_size: int


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether `path` is a regular file that starts with the GGUF magic (nothing else read)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Read and validate the header of the GGUF file at `path`; raise `GGUFError` if it is
    truncated or malformed. Metadata values are Python scalars, strings and lists."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise GGUFError(f"GGUF file {path}: not a regular file; pass a .gguf file.")
        with open(path, "rb") as f:
            return _Parser(path, f, st.st_size).parse()
    except OSError as e:
        raise GGUFError(f"GGUF file {path}: cannot be read ({e.strerror or e}).") from None


def read_tensor_bytes(header: GGUFHeader, info: TensorInfo, f=None) -> bytearray:
    """The raw bytes of one tensor. Read (not memory-mapped), so a file that shrinks after the
    header was checked is a `GGUFError`, not a SIGBUS."""
    with contextlib.nullcontext(f) if f is not None else open(header.path, "rb") as file:
        buf = bytearray(info.nbytes)
        file.seek(info.offset)
        if file.readinto(buf) != info.nbytes:
            raise GGUFError(f"GGUF file {header.path}: data of tensor {info.name!r} ends early "
                            f"(the file changed while it was read); re-download it.")
        return buf


class _Parser:
    """A cursor over the header that reads the file in growing chunks, never past the caps."""

    def __init__(self, path: Path, f, size: int):
        self.path, self.f, self.size = path, f, size
        self.limit = min(size, MAX_HEADER_BYTES)
        self.buf = bytearray()
        self.pos = 0
        self.items = 0  # metadata array elements so far

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"GGUF file {self.path}: {problem}; it is truncated or not a valid "
                         f"GGUF file — re-download or re-convert it.")

    def need(self, n: int, what: str) -> int:
        """Make `n` bytes at the cursor available; return the cursor and advance it."""
        end = self.pos + n
        if end > len(self.buf):
            if end > self.limit:
                if end > self.size:
                    raise self.fail(f"file ends inside {what} (offset {self.pos}, {n} bytes "
                                    f"needed, {self.size - self.pos} left)")
                raise self.fail(f"header is larger than forkv's {MAX_HEADER_BYTES >> 20} MiB "
                                f"cap (at {what})")
            want = min(self.limit, max(end, 2 * len(self.buf), 1 << 20)) - len(self.buf)
            chunk = self.f.read(want)
            self.buf += chunk
            if end > len(self.buf):
                raise self.fail(f"file ends inside {what} (it shrank while being read)")
        start, self.pos = self.pos, end
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self.need(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self.need(8, what))[0]

    def left(self) -> int:
        return self.limit - self.pos

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos or (max_bytes is not None and n > max_bytes):
            raise self.fail(f"{what} claims {n} bytes")
        start = self.need(n, what)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def parse(self) -> GGUFHeader:
        start = self.need(4, "the magic")
        magic = bytes(self.buf[start:start + 4])
        if magic != MAGIC:
            raise self.fail(f"magic is {magic!r}, not {MAGIC!r}")
        version = self.u32("the version")
        if version not in VERSIONS:
            if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
                raise GGUFError(f"GGUF file {self.path}: big-endian GGUF is not supported; "
                                f"use a little-endian conversion.")
            raise self.fail(f"version {version} is not one forkv reads ({VERSIONS})")
        num_tensors = self.u64("the tensor count")
        num_kv = self.u64("the metadata count")
        if num_kv > self.left() // 13:  # key length (8) + type (4) + a 1-byte value
            raise self.fail(f"metadata count {num_kv} is more than the file can hold")
        metadata: dict = {}
        for i in range(num_kv):
            key = self.string(f"metadata key #{i}", MAX_KEY_BYTES)
            if key in metadata:
                raise self.fail(f"metadata key {key!r} appears twice")
            metadata[key] = self.value(self.u32(f"the type of {key!r}"), key, 0)
        alignment = self.alignment(metadata)
        if num_tensors > self.left() // 32:  # name length, dims, one dim, type, offset
            raise self.fail(f"tensor count {num_tensors} is more than the file can hold")
        infos = [self.tensor_info(i) for i in range(num_tensors)]
        data_offset = -(-self.pos // alignment) * alignment
        if data_offset > self.size:
            raise self.fail("file ends before its tensor data")
        tensors = self.place(infos, data_offset, alignment)
        return GGUFHeader(self.path, version, metadata, tensors, alignment, data_offset,
                          self.size)

    def value(self, vtype: int, key: str, depth: int):
        fmt = _SCALARS.get(vtype)
        if fmt is not None:
            s = struct.Struct("<" + fmt)
            return s.unpack_from(self.buf, self.need(s.size, f"the value of {key!r}"))[0]
        if vtype == _STRING:
            return self.string(f"the value of {key!r}")
        if vtype != _ARRAY:
            raise self.fail(f"metadata {key!r} has unknown value type {vtype}")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"metadata {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.u32(f"the item type of {key!r}")
        count = self.u64(f"the length of {key!r}")
        fmt = _SCALARS.get(item_type)
        item_size = struct.calcsize("<" + fmt) if fmt else 8 if item_type == _STRING else 12
        if item_type not in _SCALARS and item_type not in (_STRING, _ARRAY):
            raise self.fail(f"metadata {key!r} has arrays of unknown type {item_type}")
        if count > self.left() // item_size:
            raise self.fail(f"metadata {key!r} claims {count} items, more than the file holds")
        self.items += count
        if self.items > MAX_METADATA_ITEMS:
            raise self.fail(f"metadata has more than {MAX_METADATA_ITEMS} array items")
        if fmt is not None:
            start = self.need(count * item_size, f"the items of {key!r}")
            values = struct.unpack_from(f"<{count}{fmt}", self.buf, start)
            return list(values)
        if item_type == _STRING:
            return self.strings(count, key)
        return [self.value(_ARRAY, key, depth + 1) for _ in range(count)]

    def strings(self, count: int, key: str) -> list[str]:
        # The hot loop of a 262K-token vocabulary: inline the bounds checks.
        out = [""] * count
        unpack, size = _U64.unpack_from, self.size
        for i in range(count):
            n = unpack(self.buf, self.need(8, f"item {i} of {key!r}"))[0]
            if n > size - self.pos:
                raise self.fail(f"item {i} of {key!r} claims {n} bytes")
            start = self.need(n, f"item {i} of {key!r}")
            try:
                out[i] = self.buf[start:start + n].decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail(f"item {i} of {key!r} is not valid UTF-8") from None
        return out

    def alignment(self, metadata: dict) -> int:
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1) \
                or alignment > 1 << 20:
            raise self.fail(f"general.alignment {alignment!r} is not a power of two")
        return alignment

    def tensor_info(self, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string(f"the name of tensor #{i}", MAX_TENSOR_NAME)
        num_dims = self.u32(f"the rank of tensor {name!r}")
        if not 1 <= num_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {num_dims} dimensions (1 to {MAX_DIMS})")
        ne = [self.u64(f"the shape of tensor {name!r}") for _ in range(num_dims)]
        ggml_type = self.u32(f"the type of tensor {name!r}")
        offset = self.u64(f"the offset of tensor {name!r}")
        if any(d == 0 or d > _INT64_MAX for d in ne) or math.prod(ne) > _INT64_MAX:
            raise self.fail(f"tensor {name!r} has shape {ne}")
        if ggml_type not in GGML_TYPES:
            raise self.fail(f"tensor {name!r} has unknown ggml type {ggml_type}")
        return name, tuple(ne), ggml_type, offset

    def place(self, infos, data_offset: int, alignment: int) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for name, ne, ggml_type, offset in infos:
            type_name, block, block_bytes = GGML_TYPES[ggml_type]
            if ne[0] % block:
                raise self.fail(f"tensor {name!r} ({type_name}) has a row of {ne[0]} elements, "
                                f"not a multiple of the block size {block}")
            nbytes = math.prod(ne) // block * block_bytes
            if offset % alignment:
                raise self.fail(f"tensor {name!r} data offset {offset} is not aligned to "
                                f"{alignment}")
            if offset > self.size or nbytes > self.size - data_offset - offset:
                raise self.fail(f"tensor {name!r} data ({nbytes} bytes at {offset}) lies "
                                f"outside the file")
            if name in tensors:
                raise self.fail(f"tensor {name!r} appears twice")
            tensors[name] = TensorInfo(name, tuple(reversed(ne)), ggml_type,
                                       data_offset + offset, nbytes)
        end = data_offset
        for info in sorted(tensors.values(), key=lambda t: t.offset):
            if info.offset < end:
                raise self.fail(f"tensor {info.name!r} data overlaps the tensor before it")
            end = info.offset + info.nbytes
        return tensors
