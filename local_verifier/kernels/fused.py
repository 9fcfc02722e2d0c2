"""The layer stack of a step in one C++ call (``dg_stack_step``): the per-op path's kernels
in the same order on the same values, so bitwise the same logits and K/V, without Python,
ctypes and allocation per op. Every family's layer (``stack_weights.LayerWeights``: q/k
norms, post norms, GeGLU, sliding windows, a second rope table as per-layer data). Used by
``Transformer.step`` on the C++ backend unless ``KernelOptions.fused`` is off
(``DRAFTGATE_FUSED=0``: then it runs op by op through ``CppOps``)."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from typing import TypeVar

import torch

from local_verifier.kernels.cpp import MAX_HEAD_DIM, output_tensor
from local_verifier.kernels.packing import dense_shape, layout_of, quant_type
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.stack_weights import ACTIVATIONS, LayerWeights, StackWeights
from local_verifier.kernels.step_args import PLAN_SLOTS, ROPE_SLOTS, Plan, Rope, StepArgs

LAYOUT_CODES = {"row": 0, "packed": 1, "amx": 2}  # a weight's layout, as dg_stack_new takes it
QUANT_CODE = 100  # + the GGML type: a weight of GGUF blocks (``quant``)
PROFILE_KINDS = ("linear", "head", "attention", "row_ops")  # the entries of ``profile``
_Slot = TypeVar("_Slot", Plan, Rope)


class FusedStack:
    """A model's weight table in the C++ library, built once. It holds the parameters'
    addresses: values copied into them in place are read by the next step, but parameters
    replaced by new tensors are not seen (a model drops its stack when it is cast or
    moved). ``profile``, unless None, is a float64 [4] tensor each step adds its seconds
    per ``PROFILE_KINDS`` to."""

    def __init__(self, library: ctypes.CDLL, weights: StackWeights) -> None:
        layers, norm, head = weights.layers, weights.norm, weights.head
        n_heads = weights.n_heads
        self._lib = library
        self.dtype = norm.dtype
        """The weights' dtype (the norms', and the linears' that are not GGUF blocks), and the
        K/V storage's the stack reads and writes."""
        windows = weights.windows()
        self.window = min(windows) if windows else None
        """The sliding layers' window (``run``'s second plan), None without one."""
        self.local_rope = any(w.local_rope for w in layers)
        """Whether some layer rotates by the second rope table (``run``'s second rope)."""
        self._params = [norm, head, *(t for w in layers for t in w.tensors())]  # kept alive
        self.vocab, dim = dense_shape(head)
        pointers = [None if t is None else t.data_ptr() for t in self._params]
        layouts = [_layout_code(t) for t in self._params]
        eps = [e for w in layers for e in w.eps()] + [weights.norm_eps]
        switches = [s for w in layers for s in _switches(w)]
        self._handle = library.dg_stack_new(
            len(layers), dim, n_heads, weights.n_kv_heads, _head_dim(layers[0], n_heads),
            dense_shape(layers[0].w2)[1], self.vocab, self.dtype == torch.bfloat16,
            (ctypes.c_void_p * len(pointers))(*pointers), (ctypes.c_int * len(layouts))(*layouts),
            (ctypes.c_float * len(eps))(*eps), (ctypes.c_int * len(switches))(*switches),
        )  # fmt: skip
        if not self._handle:
            raise TypeError("the C++ stack does not run a quantized type of these weights")
        weakref.finalize(self, library.dg_stack_free, self._handle)
        self.profile: torch.Tensor | None = None

    @classmethod
    def build(cls, library: ctypes.CDLL, weights: StackWeights) -> FusedStack | None:
        """The stack, or None where it does not apply (parameters not all contiguous float32
        or all bfloat16, GGUF blocks aside, a head geometry the C++ attention does not take,
        sliding layers of several windows: the per-op path then runs, or says why it
        cannot)."""
        layers, norm, n_heads = weights.layers, weights.norm, weights.n_heads
        tensors = [norm, weights.head, *(t for w in layers for t in w.tensors() if t is not None)]
        dtype = norm.dtype
        if dtype not in (torch.float32, torch.bfloat16) or not layers:
            return None
        if any(
            (t.dtype != dtype and layout_of(t) != "quant")
            or t.device.type != "cpu"
            or not t.is_contiguous()
            for t in tensors
        ):
            return None
        head_dim = _head_dim(layers[0], n_heads)
        if head_dim > MAX_HEAD_DIM or n_heads % weights.n_kv_heads:
            return None
        if len(weights.windows()) > 1 or any(w.activation not in ACTIVATIONS for w in layers):
            return None  # one window for the sliding layers (the plan's second slot)
        return cls(library, weights)

    def run(
        self,
        x: torch.Tensor,
        new_slots: torch.Tensor,
        ropes: Sequence[tuple[torch.Tensor, torch.Tensor]],
        plans: Sequence[AttentionPlan],
        k: torch.Tensor,
        v: torch.Tensor,
        picked: torch.Tensor,
        head: bool = True,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """float32 logits [P, vocab] of the ``picked`` rows (long [P]) of a step over the
        rows of ``x`` (float32 [N, dim] embeddings, overwritten), or with ``head`` False
        those rows' final-normed hidden states [P, dim], the input of the head (the model's
        ``head`` linear gives the same logits); writes each row's K/V to
        its slot of every layer of ``k``/``v`` (``KVStorage``'s, contiguous, in ``dtype``).
        ``ropes``: the rows' (cos, sin) [N, head_dim] of the model's rope table, then (where
        ``local_rope``) of the sliding layers'; ``plans``: every row's keys, then (where
        ``window``) the plan cut to the window. ``out``: where the result goes (float32, of
        its shape, contiguous), else new memory."""
        if k.dtype != self.dtype or v.dtype != self.dtype:
            raise TypeError(f"a {self.dtype} stack's K/V must be {self.dtype}, not {k.dtype}")
        if len(ropes) < 1 + self.local_rope or len(plans) < 1 + (self.window is not None):
            raise ValueError("a sliding layer's plan or rope table is missing")
        out = output_tensor(out, picked.shape[0], self.vocab if head else x.shape[1])
        profile = None if self.profile is None else self.profile.data_ptr()
        rope_slots = [Rope(cos.data_ptr(), sin.data_ptr()) for cos, sin in ropes]
        plan_slots = [Plan(*plan.pointers(), len(plan.ctx_len)) for plan in plans]
        args = StepArgs(
            x=x.data_ptr(), rope=_slots(rope_slots, ROPE_SLOTS),
            new_slots=new_slots.data_ptr(), n_rows=x.shape[0], k_cache=k.data_ptr(),
            v_cache=v.data_ptr(), n_slots=v.shape[1], plan=_slots(plan_slots, PLAN_SLOTS),
            picked=picked.data_ptr(), n_picked=picked.shape[0],
            logits=out.data_ptr() if head else None, threads=torch.get_num_threads(),
            seconds=profile, hidden=None if head else out.data_ptr(),
        )  # fmt: skip
        self._lib.dg_stack_step(self._handle, ctypes.byref(args))
        return out


def _slots(given: Sequence[_Slot], count: int) -> ctypes.Array[_Slot]:
    """``given`` in a ctypes array of ``count`` (slots past them: the first one again, for no
    layer to read)."""
    return (type(given[0]) * count)(*given, *[given[0]] * (count - len(given)))


def _switches(layer: LayerWeights) -> list[int]:
    """A layer's switches in the C++ stack's order (``LayerSwitch``): its activation, its
    plan slot (1: the window's), its rope slot (1: the sliding layers' table) and whether its
    q and k rows lie in pair order."""
    return [
        ACTIVATIONS.index(layer.activation),
        int(layer.window is not None),
        int(layer.local_rope),
        int(layer.qk_pairs),
    ]


def _layout_code(weight: torch.Tensor | None) -> int:
    if weight is None:
        return 0
    layout = layout_of(weight)
    return QUANT_CODE + int(quant_type(weight)) if layout == "quant" else LAYOUT_CODES[layout]


def _head_dim(layer: LayerWeights, n_heads: int) -> int:
    return dense_shape(layer.wo)[1] // n_heads
