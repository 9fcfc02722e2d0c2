"""Batch-invariant kernels of one forward step, and the choice between them.

Every implementation computes every row's output by a fixed sequence of operations that
does not depend on the other rows of the call (their number, values or order), so a row's
logits and K/V are bitwise the same alone, batched, in a draft tree or in a prompt chunk:

- ``cpp``: C++ kernels compiled at first use (x86-64 with AVX2 + FMA, AVX-512 where the
  CPU has it; float32 activations; linear weights float32 or bfloat16, the bf16 target's,
  widened exactly in the kernel; on CPUs with AMX-BF16, bf16 weights run on AMX tiles, on
  CPUs with AVX512-BF16 and no AMX on bf16 dot products, with each linear's input rounded
  to bf16, ``DRAFTGATE_AMX=0`` turns that off): fixed-order
  reductions, attention over each row's own key list with an online softmax in
  key order. ``Transformer.step`` runs them as one C++ call per step (``fused.FusedStack``:
  the same kernels in the same order, bitwise the same), or op by op through ``CppOps``
  with ``DRAFTGATE_FUSED=0``.
- ``triton``: fixed-order Triton kernels (``triton_kernels``), the default on CUDA where
  Triton is installed; a Llama-family step runs as one CUDA graph per row bucket
  (``triton_stack.StepGraphs``), other families op by op through ``TritonOps``.
- ``torch``: stock torch ops on fixed-size row tiles (a row count the matrix product is
  row-independent at) and attention one row at a time over its own keys; used on CUDA
  without Triton, on MPS and where the C++ build is unavailable. Invariant, slower.

The switches among them (``DRAFTGATE_KERNELS``, ``DRAFTGATE_FUSED``, ``DRAFTGATE_PACKED``,
``DRAFTGATE_AMX``) are read once per model into its ``KernelOptions`` (``options``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from typing import Protocol

import torch

from local_verifier.kernels.options import Backend, KernelOptions
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.torch_ops import TorchOps

__all__ = ["AttentionPlan", "KernelOptions", "StepOps", "step_ops"]

log = logging.getLogger(__name__)


class StepOps(Protocol):
    """The row-wise operations of a step; every output row depends on its own inputs only."""

    name: str

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def rope_store(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        new_slots: torch.Tensor,
        n_heads: int,
        n_kv_heads: int,
    ) -> torch.Tensor: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor: ...


def step_ops(device: torch.device, dtype: torch.dtype, backend: Backend = "") -> StepOps:
    """The kernels for ``device``/``dtype`` and ``backend`` (``KernelOptions.backend``):
    chosen once per process and argument, and logged."""
    return _ops_for(device.type, dtype, backend)


@functools.cache
def _ops_for(device_type: str, dtype: torch.dtype, wanted: Backend) -> StepOps:
    ops = _choose(device_type, dtype, wanted)
    activations = str(dtype).removeprefix("torch.")
    log.info("forward step kernels on %s, %s activations: %s", device_type, activations, ops.name)
    return ops


def _choose(device_type: str, dtype: torch.dtype, wanted: Backend) -> StepOps:
    if wanted == "triton" or (wanted == "" and device_type == "cuda" and _has_triton()):
        if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"the Triton step kernels run on CUDA, not {device_type} (on the CPU only "
                "under Triton's interpreter, TRITON_INTERPRET=1, for tests)"
            )
        from local_verifier.kernels.triton_ops import TritonOps

        return TritonOps()
    if wanted != "torch" and device_type == "cpu" and dtype == torch.float32:
        from local_verifier.kernels.cpp import CppOps, load_library

        library, reason = load_library()
        if library is not None:
            return CppOps(library)
        if wanted == "cpp":
            raise RuntimeError(f"C++ step kernels unavailable: {reason}")
        log.warning("C++ step kernels unavailable (%s); using the slower torch kernels", reason)
    elif wanted == "cpp":
        raise RuntimeError(
            f"C++ step kernels run on float32 CPU activations, not {device_type}/{dtype}"
        )
    return TorchOps()


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None
