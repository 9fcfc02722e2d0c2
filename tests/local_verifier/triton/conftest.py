"""The Triton kernels' tests run on CUDA where there is a GPU, else on CPU tensors under
Triton's interpreter, which must be chosen before the kernels are first imported.

The interpreter computes ``tl.dot`` with ``numpy.matmul``, whose BLAS may round a row
differently by its place in the tile (OpenBLAS 0.3.31 does, even for one row), which a
GPU's fixed-order dot does not. Under the interpreter each output element is therefore
summed over K in one fixed order, so the tests check our kernels' own order and tiling.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

INTERPRETED = not torch.cuda.is_available()
if INTERPRETED:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _values(handle: Any) -> np.ndarray:
    """A tensor handle's values as numbers (the interpreter keeps bf16 as its uint16 bits)."""
    import triton.language as tl

    if handle.dtype.scalar == tl.bfloat16:
        return (handle.data.astype(np.uint32) << 16).view(np.float32)
    return handle.data


def _fixed_order_dot(
    self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any
) -> Any:
    from triton.runtime.interpreter import TensorHandle

    acc = d.data.dtype
    x, y = _values(a).astype(acc), _values(b).astype(acc)
    out = np.zeros(d.data.shape, dtype=acc)
    for k in range(x.shape[-1]):  # K in order, the same for every row of the tile
        out += x[..., :, k : k + 1] * y[..., k : k + 1, :]
    return TensorHandle(out + d.data, d.dtype.scalar)


@pytest.fixture(scope="session", autouse=True)
def _interpreter_dot() -> Any:
    if not INTERPRETED:
        yield
        return
    from triton.runtime.interpreter import InterpreterBuilder

    original = InterpreterBuilder.create_dot
    InterpreterBuilder.create_dot = _fixed_order_dot  # type: ignore[method-assign]
    yield
    InterpreterBuilder.create_dot = original  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
