"""Loading weights at the model's own size.

The model is built on the ``meta`` device (no storage), its size in the target dtype checked
against the memory the device has free, then each parameter allocated once, uninitialised, in
the target dtype on the target device; a checkpoint ``TensorSource`` writes every tensor
straight into its place (row slices of the fused matrices), converting once, in chunks of at
most ``CHUNK_BYTES`` so that what the load holds besides the weights stays small.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from local_verifier.errors import ModelLoadError

CHUNK_BYTES = 64 << 20  # at most this much of a tensor read (or dequantized) at a time
MEMINFO = Path("/proc/meminfo")
GIB = 2**30


class TensorSource(Protocol):
    """A checkpoint's tensors under Hugging Face names, read on demand."""

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape, or None when the checkpoint has no such tensor."""

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Write the tensor's values into ``out`` (its shape, any dtype and device)."""


def row_chunks(rows: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    """[start, end) row ranges of at most ``CHUNK_BYTES`` each (at least one row)."""
    step = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of ``model``'s parameters in ``dtype`` (a shared parameter once)."""
    return sum(
        p.numel() * (dtype if p.is_floating_point() else p.dtype).itemsize
        for p in model.parameters()
    )


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a load on ``device`` (CUDA: the driver's free figure; CPU:
    ``MemAvailable``), or None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu" and MEMINFO.exists():
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def check_fits(weights: int, kv_cache_bytes: int, device: torch.device) -> None:
    """Raise ``ModelLoadError`` when the weights and the K/V cache exceed the free memory."""
    free = available_bytes(device)
    needed = weights + kv_cache_bytes
    if free is not None and needed > free:
        raise ModelLoadError(
            f"the model needs {needed / GIB:.2f} GiB ({weights / GIB:.2f} GiB of weights + "
            f"{kv_cache_bytes / GIB:.2f} GiB of K/V cache) but {device} has {free / GIB:.2f} GiB "
            "available; use a smaller model, the bf16 target (dtype) or a smaller kv_cache_mb"
        )


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give every parameter of a ``meta`` model still on ``meta`` uninitialised storage in
    ``dtype`` (floating point ones) on ``device``, keeping shared parameters shared."""
    shared: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            if id(param) not in shared:
                kind = dtype if param.is_floating_point() else param.dtype
                shared[id(param)] = nn.Parameter(
                    torch.empty(param.shape, dtype=kind, device=device),
                    requires_grad=param.requires_grad,
                )
            setattr(module, name, shared[id(param)])
