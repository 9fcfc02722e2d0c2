"""A ``TensorSource`` over safetensors files, read in place from their memory maps."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from local_verifier.errors import ModelLoadError
from local_verifier.weights import row_chunks


class SafetensorsSource:
    """The tensors of one or more safetensors files (a checkpoint's shards).

    A tensor is copied from the file's memory map into its destination chunk by chunk, the
    file opened again for each chunk: pages of a mapping stay resident until it is closed,
    so that a load holds at most one chunk of the file besides the weights.
    ``offset_norms``: norm weights are read as the ``1 + w`` they apply (Gemma)."""

    def __init__(self, files: list[Path], offset_norms: bool = False) -> None:
        self._files: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._offset_norms = offset_norms
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (a handle, not a dict)
                        self._files[name] = path
                        self._shapes[name] = tuple(f.get_slice(name).get_shape())
            except Exception as exc:  # a truncated or corrupt file; safetensors' own types
                raise ModelLoadError(f"cannot read safetensors file {path}: {exc}") from exc

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self._shapes.get(name)

    def read_into(self, name: str, out: torch.Tensor) -> None:
        path = self._files[name]
        offset = self._offset_norms and name.endswith("norm.weight")
        row_bytes = out[0].numel() * 4 if out.dim() > 1 else 4
        try:
            for start, end in row_chunks(out.shape[0], row_bytes):
                with safe_open(str(path), framework="pt") as f:
                    values = f.get_slice(name)[start:end]
                    out[start:end].copy_(values.float() + 1.0 if offset else values)
        except Exception as exc:
            raise ModelLoadError(f"cannot read tensor {name} from {path}: {exc}") from exc
