"""The packed layout of a linear weight for the C++ kernels (``step_cpu.cpp``, "Linear
layers"): tiles of ``PACK`` output columns, each tile's values in blocks of ``PACK`` values
of k, ``[M / PACK, K / PACK, PACK, PACK]``, so that a tile, and a thread's run of tiles, is
one sequential stream. The same values in another order: packing and unpacking are exact,
and the kernels sum every output in the same order in both layouts (bitwise the same y)."""

from __future__ import annotations

import os

import torch

PACK = 16
PACKED_ENV = "DRAFTGATE_PACKED"  # "0": the C++ backend reads linear weights row-major


def packing_enabled() -> bool:
    """Whether the C++ backend packs linear weights (``DRAFTGATE_PACKED``)."""
    return os.environ.get(PACKED_ENV, "1") != "0"


def is_packed(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is a packed [M / PACK, K / PACK, PACK, PACK] weight."""
    return weight.dim() == 4


def packable(weight: torch.Tensor) -> bool:
    """Whether a row-major [M, K] weight is held packed: bfloat16 (a float32 weight streams
    faster row-major, 16 rows at a time: benchmarks/RESULTS.md, "Packed weights"), M and K
    multiples of ``PACK``."""
    return (
        weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % PACK == 0
        and weight.shape[1] % PACK == 0
    )


def dense_shape(weight: torch.Tensor) -> tuple[int, int]:
    """(M, K) of a weight in either layout."""
    if is_packed(weight):
        return weight.shape[0] * PACK, weight.shape[1] * PACK
    m, k = weight.shape
    return m, k


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The packed copy of a row-major weight whose M and K are multiples of ``PACK``."""
    m, k = weight.shape
    return weight.reshape(m // PACK, PACK, k // PACK, PACK).permute(0, 2, 1, 3).contiguous()


def unpack(weight: torch.Tensor) -> torch.Tensor:
    """The row-major copy of a packed weight."""
    return weight.permute(0, 2, 1, 3).reshape(dense_shape(weight))
