"""The packed layouts of a linear weight for the C++ kernels (``cpu/linear.h``), the
same values in another order (packing and unpacking are exact):

- ``packed``: tiles of ``PACK`` output columns, each tile's values in blocks of ``PACK``
  values of k, ``[M / PACK, K / PACK, PACK, PACK]``, so that a tile, and a thread's run of
  tiles, is one sequential stream. The kernels sum every output in the same order as on
  the row-major weight (bitwise the same y).
- ``amx``: a bf16 weight for the bf16 kernels, tiles of ``PACK`` output columns along k in
  blocks of ``AMX_K``, each block in the AMX tiles' pairwise (VNNI) order:
  ``[M / PACK, K / AMX_K, AMX_K / 2, PACK, 2]``; one pair of k of a column tile is 64
  bytes, 16 columns x 2 values. On CPUs with AMX-BF16 the AMX tile kernels read it (a tile
  of B is one k block), on CPUs with AVX512-BF16 and no usable AMX the dot-product kernels
  (one pair row is the vector ``vdpbf16ps`` takes, 16 output columns per instruction).
  Both round a linear's input to bf16 and sum in their own fixed order (``cpu/amx.h``,
  ``cpu/dot.h``): a different y from the row-major weight's, the same for every row count.
  ``DRAFTGATE_AMX=0`` turns both off (bf16 weights ``packed`` for the float32 kernels).
- ``quant``: a GGUF quantized weight as the file holds it, uint8 ``[M, blocks per row, bytes
  per block]`` (``QUANT_BLOCKS``: the type follows from the block's size); the C++ kernels
  run it as it is (``cpu/quant.h``), it is never repacked."""

from __future__ import annotations

import mmap
from typing import Literal

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from local_verifier.huge_pages import HUGE_PAGE, huge_page_mapping

PACK = 16
AMX_K = 32

Layout = Literal["row", "packed", "amx", "quant"]
_LAYOUTS: dict[int, Layout] = {3: "quant", 4: "packed", 5: "amx"}
_Q = GGMLQuantizationType
# bytes per block: (the GGML type, values per block) of the types the C++ kernels run
QUANT_BLOCKS: dict[int, tuple[GGMLQuantizationType, int]] = {
    18: (_Q.Q4_0, 32),
    20: (_Q.Q4_1, 32),
    22: (_Q.Q5_0, 32),
    34: (_Q.Q8_0, 32),
    144: (_Q.Q4_K, 256),
    176: (_Q.Q5_K, 256),
    210: (_Q.Q6_K, 256),
}
QUANT_TYPES = {qtype: (size, values) for size, (qtype, values) in QUANT_BLOCKS.items()}


def layout_of(weight: torch.Tensor) -> Layout:
    """The layout a weight (or a vector: ``row``) is held in, by its number of dimensions
    (``quant``: a uint8 tensor of three)."""
    return _LAYOUTS.get(weight.dim(), "row")


def is_packed(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is held in a packed layout (``packed`` or ``amx``)."""
    return weight.dim() > 3


def quant_type(weight: torch.Tensor) -> GGMLQuantizationType:
    """The GGML type of a weight in the ``quant`` layout."""
    return QUANT_BLOCKS[weight.shape[2]][0]


def quant_blocks(rows: int, cols: int, qtype: GGMLQuantizationType) -> tuple[int, int, int]:
    """The ``quant`` shape of an [rows, cols] weight of ``qtype`` (cols a whole number of
    blocks)."""
    size, values = QUANT_TYPES[qtype]
    return rows, cols // values, size


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The float32 values [M, K] of a ``quant`` weight (the gguf package's dequantization)."""
    values = dequantize(weight.reshape(weight.shape[0], -1).numpy(), quant_type(weight))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def packable(weight: torch.Tensor, layout: Layout) -> bool:
    """Whether a row-major [M, K] weight is held in ``layout`` (``row`` always): bfloat16
    (a float32 weight streams faster row-major, 16 rows at a time: ``python -m
    benchmarks.kernels.bench_gemv``), M a multiple of ``PACK``, K of ``PACK`` (``AMX_K``
    for ``amx``)."""
    if layout == "row":
        return True
    k_block = AMX_K if layout == "amx" else PACK
    return (
        weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % PACK == 0
        and weight.shape[1] % k_block == 0
    )


def dense_shape(weight: torch.Tensor) -> tuple[int, int]:
    """(M, K) of a weight in any layout."""
    layout = layout_of(weight)
    if layout == "row":
        m, k = weight.shape
        return m, k
    if layout == "quant":
        return weight.shape[0], weight.shape[1] * QUANT_BLOCKS[weight.shape[2]][1]
    return weight.shape[0] * PACK, weight.shape[1] * (AMX_K if layout == "amx" else PACK)


def pack(weight: torch.Tensor, layout: Layout = "packed") -> torch.Tensor:
    """The ``layout`` copy of a row-major weight that is ``packable`` to it."""
    m, k = weight.shape
    if layout == "amx":
        tiles = weight.reshape(m // PACK, PACK, k // AMX_K, AMX_K // 2, 2).permute(0, 2, 3, 1, 4)
        return _ARENA.empty(tiles.shape, weight.dtype).copy_(tiles)
    if layout == "packed":
        tiles = weight.reshape(m // PACK, PACK, k // PACK, PACK).permute(0, 2, 1, 3)
        return _ARENA.empty(tiles.shape, weight.dtype).copy_(tiles)
    return weight


def unpack(weight: torch.Tensor) -> torch.Tensor:
    """The row-major copy of a weight in any layout (itself if row-major or ``quant``: its
    blocks are its only form)."""
    layout = layout_of(weight)
    if layout == "amx":
        return weight.permute(0, 3, 1, 2, 4).reshape(dense_shape(weight))
    if layout == "packed":
        return weight.permute(0, 2, 1, 3).reshape(dense_shape(weight))
    return weight


def gather_rows(weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of a weight held in any layout, row-major ``[len(index), K]`` (the same
    values as ``unpack(weight)[index]``, without unpacking the rest): a tied embedding read
    from the head's packed weight."""
    layout = layout_of(weight)
    if layout == "row":
        return weight[index]
    if layout == "quant":  # the rows' blocks dequantized
        return dequantized(weight[index])
    tile, lane = index // PACK, index % PACK
    rows = weight[tile, :, lane] if layout == "packed" else weight[tile, :, :, lane]
    return rows.reshape(index.shape[0], -1)


class _HugePageArena:
    """Memory for packed weights on transparent huge pages (``huge_pages``): a step streams
    every weight once, and 2 MiB pages spare it a TLB miss per 4 KiB (about 10% of a 1-row
    step's streaming time). Small weights share a chunk."""

    CHUNK = 32 << 20  # bytes per shared mapping, a multiple of HUGE_PAGE
    ALIGN = 4096  # each weight starts on a page

    def __init__(self) -> None:
        self._chunk: tuple[mmap.mmap, int] | None = None  # the mapping, its next free offset

    def empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        size = shape.numel() * dtype.itemsize
        if size == 0:
            return torch.empty(shape, dtype=dtype)
        span = -(-size // self.ALIGN) * self.ALIGN
        if span > self.CHUNK // 4:  # a mapping of its own
            mapped = huge_page_mapping(-(-span // HUGE_PAGE) * HUGE_PAGE)
        else:  # the rest of the current chunk, or a new one
            if self._chunk is None or self._chunk[1] + span > self.CHUNK:
                self._chunk = huge_page_mapping(self.CHUNK)
            mapped = self._chunk
            if mapped is not None:
                self._chunk = (mapped[0], mapped[1] + span)
        if mapped is None:  # no transparent huge pages here
            return torch.empty(shape, dtype=dtype)
        buffer, offset = mapped
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=offset)
        return flat.view(dtype).view(shape)


_ARENA = _HugePageArena()
