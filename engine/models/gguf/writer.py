"""Streaming safetensors output: plan shards from shapes up front, then write one tensor at a
time, so a conversion holds one tensor in memory, never the whole model.

Writes `model.safetensors`, or `model-0000i-of-0000n.safetensors` plus
`model.safetensors.index.json` past the shard size, the layout mlx-lm and transformers load.
Knows the safetensors format only: not where tensors come from.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

__all__ = ["SHARD_BYTES", "ShardWriter"]

SHARD_BYTES = 4 << 30  # ~4 GiB per file, as mlx-lm's save does (5 GB there)
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}  # U32: packed quantized weights


class ShardWriter:
    """`ShardWriter(folder, [(name, shape, tag), ...])`, then `write(name, array)` for each
    tensor in the same order, then `close()`."""

    def __init__(self, folder: Path, plan: list[tuple[str, tuple[int, ...], str]],
                 shard_bytes: int | None = None, metadata: dict[str, str] | None = None):
        shard_bytes = shard_bytes or SHARD_BYTES
        self.folder, self.metadata = folder, dict(metadata or {}, format="mlx")
        self.shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
        size = 0
        for entry in plan:
            nbytes = int(np.prod(entry[1], dtype=np.int64)) * _ITEMSIZE[entry[2]]
            if self.shards[-1] and size + nbytes > shard_bytes:
                self.shards.append([])
                size = 0
            self.shards[-1].append(entry)
            size += nbytes
        n = len(self.shards)
        self.names = (["model.safetensors"] if n == 1 else
                      [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        self.order = [(i, e) for i, shard in enumerate(self.shards) for e in shard]
        self.next = 0
        self.file = None
        self.shard = -1

    def write(self, name: str, array: np.ndarray) -> None:
        shard, (expect, shape, _) = self.order[self.next]
        assert name == expect and tuple(array.shape) == tuple(shape), (name, array.shape)
        if shard != self.shard:
            self._open(shard)
        self.file.write(memoryview(np.ascontiguousarray(array)).cast("B"))
        self.next += 1

    def _open(self, shard: int) -> None:
        if self.file is not None:
            self.file.close()
        self.shard = shard
        header, offset = {"__metadata__": self.metadata}, 0
        for name, shape, tag in self.shards[shard]:
            end = offset + int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[tag]
            header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, end]}
            offset = end
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        # Held across write() calls, closed by the next _open or close().
        self.file = open(self.folder / self.names[shard], "wb")  # noqa: SIM115
        self.file.write(struct.pack("<Q", len(raw)) + raw)

    def close(self) -> list[str]:
        """Finish the last shard and write the index if sharded; return the file names."""
        assert self.next == len(self.order), "not every planned tensor was written"
        if self.file is not None:
            self.file.close()
        if len(self.names) > 1:
            total = sum(int(np.prod(s, dtype=np.int64)) * _ITEMSIZE[t] for _, (_, s, t)
                        in self.order)
            index = {"metadata": {"total_size": total},
                     "weight_map": {e[0]: self.names[i] for i, e in self.order}}
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return self.names
