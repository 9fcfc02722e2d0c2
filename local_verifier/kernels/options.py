"""The kernel switches: read from the environment once, when a model is built, and passed
down from there (a step reads the model's options, never the environment)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

BACKEND_ENV = "DRAFTGATE_KERNELS"  # "cpp" | "torch" | "triton": force one (default below)
FUSED_ENV = "DRAFTGATE_FUSED"  # "0": the C++ backend runs a step op by op
PACKED_ENV = "DRAFTGATE_PACKED"  # "0": the C++ backend reads linear weights row-major
AMX_ENV = "DRAFTGATE_AMX"  # "0": no bf16 kernels (AMX or dot products), float32 ones
GRAPHS_ENV = "DRAFTGATE_CUDA_GRAPHS"  # "0": the Triton backend runs its steps eagerly

Backend = Literal["", "cpp", "torch", "triton"]
_BACKENDS: dict[str, Backend] = {"": "", "cpp": "cpp", "torch": "torch", "triton": "triton"}


@dataclass(frozen=True)
class KernelOptions:
    """Which step kernels a model runs. ``backend`` picks among kernels with orders of their
    own; for the bf16 target on a CPU with bf16 arithmetic, ``amx`` and ``packed`` change
    bits too (the bf16 kernels round each linear's input to bf16 and run on packed weights
    only); ``fused`` and ``graphs`` choose among bitwise-equal paths."""

    backend: Backend = ""
    """``cpp``, ``torch`` or ``triton`` to force one; "" for the C++ kernels where they build
    on the CPU, the Triton kernels on CUDA where Triton is installed, else torch's."""
    fused: bool = True
    """The C++ backend runs a step's layer stack in one call (``fused.FusedStack``)."""
    packed: bool = True
    """The C++ backend packs linear weights (``packing``)."""
    amx: bool = True
    """bf16 weights run on the bf16 kernels where the CPU has them (AMX or AVX512-BF16)."""
    graphs: bool = True
    """The Triton backend replays a Llama-family step as a CUDA graph per row bucket."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelOptions:
        """The options ``environ`` (default: the process's) sets, each unset one its
        default; a switch is off only at "0"."""
        env = os.environ if environ is None else environ
        wanted = env.get(BACKEND_ENV, "")
        backend = _BACKENDS.get(wanted)
        if backend is None:
            raise ValueError(f"{BACKEND_ENV} must be 'cpp', 'torch' or 'triton', got {wanted!r}")
        return cls(
            backend=backend,
            fused=env.get(FUSED_ENV, "1") != "0",
            packed=env.get(PACKED_ENV, "1") != "0",
            amx=env.get(AMX_ENV, "1") != "0",
            graphs=env.get(GRAPHS_ENV, "1") != "0",
        )
