"""A GGUF file's metadata and tensor index, read in one pass of ``struct`` unpacking.

The gguf package's ``GGUFReader`` builds numpy views for every part of every value: tens of
seconds for a 262k-token vocabulary. Here metadata values are plain Python values (arrays
as lists, numeric ones through one ``numpy.frombuffer``) and each tensor's ``data`` is a
view of the file's memory map, shaped as ``GGUFReader`` shapes it (float and integer types
as such, the quantized ones as bytes per row), with nothing read until used.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_Q = GGMLQuantizationType
_ELEMENT_TYPES = {
    _Q.F32: np.float32,
    _Q.F16: np.float16,
    _Q.F64: np.float64,
    _Q.I8: np.int8,
    _Q.I16: np.int16,
    _Q.I32: np.int32,
    _Q.I64: np.int64,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file (``gguf.ReaderTensor``'s attributes that loading reads)."""

    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    tensor_type: GGMLQuantizationType
    data_offset: int  # from the start of the file
    n_bytes: int
    data: np.ndarray  # a view of the file's memory map


class GGUFFile:
    """``fields`` (key -> value) and ``tensors`` of a little-endian GGUF file (version 2 or
    3); ValueError where the file is not one or is cut short."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._offset = 0
        if self._take(4) != MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic)")
        version = self._unpack("I")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} (big-endian or unknown); read: 2, 3")
        n_tensors, n_fields = self._unpack("Q"), self._unpack("Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("I"))
        index = [self._tensor_index() for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._offset // alignment) * alignment
        whole = np.memmap(self.path, mode="r")
        self.tensors = [self._tensor(whole, start, *entry) for entry in index]

    def _take(self, n: int) -> bytes:
        end = self._offset + n
        if end > len(self._map):
            raise ValueError("the GGUF file is truncated in its metadata")
        data = self._map[self._offset : end]
        self._offset = end
        return data

    def _unpack(self, code: str) -> Any:
        (value,) = struct.unpack("<" + code, self._take(struct.calcsize(code)))
        return value

    def _string(self) -> str:
        return self._take(self._unpack("Q")).decode("utf-8", errors="replace")

    def _value(self, kind: int) -> Any:
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            item, count = self._unpack("I"), self._unpack("Q")
            if item in _SCALARS:
                dtype = np.dtype("<" + _SCALARS[item])
                return np.frombuffer(self._take(dtype.itemsize * count), dtype).tolist()
            return [self._value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self._unpack(_SCALARS[kind])

    def _tensor_index(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        dims = tuple(self._unpack("Q") for _ in range(self._unpack("I")))
        return name, dims, self._unpack("I"), self._unpack("Q")

    def _tensor(
        self, whole: np.ndarray, start: int, name: str, dims: tuple[int, ...], kind: int, at: int
    ) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise ValueError(f"tensor {name} has unknown GGML type {kind}") from None
        if qtype not in GGML_QUANT_SIZES:
            raise ValueError(f"tensor {name} has GGML type {qtype.name}, which has no block size")
        block, size = GGML_QUANT_SIZES[qtype]
        if not dims or min(dims) < 1 or dims[0] % block:
            raise ValueError(
                f"tensor {name} of type {qtype.name} has shape {list(dims)}: its rows must hold "
                f"whole blocks of {block} values"
            )
        n_bytes = math.prod(dims) * size // block
        offset = start + at
        if offset + n_bytes > len(whole):
            raise ValueError(f"the GGUF file is truncated (tensor {name})")
        shape = tuple(reversed(dims))
        dtype = _ELEMENT_TYPES.get(qtype)
        if dtype is None:
            dtype, shape = np.uint8, quant_shape_to_byte_shape(shape, qtype)
        data = whole[offset : offset + n_bytes].view(dtype).reshape(shape)
        return TensorInfo(name, dims, qtype, offset, n_bytes, data)
