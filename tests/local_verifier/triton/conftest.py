"""The Triton kernels' tests run on CUDA where there is a GPU, else on CPU tensors under
Triton's interpreter, which must be chosen before the kernels are first imported."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
