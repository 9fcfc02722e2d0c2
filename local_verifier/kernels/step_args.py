"""The argument structs of ``dg_stack_step``: the ctypes mirrors of ``DgStepArgs``, ``DgPlan``
and ``DgRope`` (``cpu/stack_args.h``), field for field in the same order and of the same C
types."""

from __future__ import annotations

import ctypes

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
PLAN_SLOTS = 2  # kPlanSlots: every key of a row, or its last ``window`` keys
ROPE_SLOTS = 2  # kRopeSlots: the model's rope base, or the sliding layers' own


class Plan(ctypes.Structure):
    """An attention plan's arrays (``AttentionPlan.pointers``) and its sequence count."""

    _fields_ = [
        ("keys", _ptr),
        ("key_start", _ptr),
        ("row_start", _ptr),
        ("ctx_len", _ptr),
        ("masks", _ptr),
        ("mask_start", _ptr),
        ("n_seqs", _i64),
    ]


class Rope(ctypes.Structure):
    """The step's rows' cos and sin of one rope table."""

    _fields_ = [("cos", _ptr), ("sin", _ptr)]


class StepArgs(ctypes.Structure):
    """One fused step's inputs and outputs: addresses of contiguous tensors (None: a null
    pointer) and their sizes. See ``DgStepArgs`` for what each field holds."""

    _fields_ = [
        ("x", _ptr),
        ("rope", Rope * ROPE_SLOTS),
        ("new_slots", _ptr),
        ("n_rows", _i64),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
        ("n_slots", _i64),
        ("plan", Plan * PLAN_SLOTS),
        ("picked", _ptr),
        ("n_picked", _i64),
        ("logits", _ptr),
        ("threads", ctypes.c_int),
        ("seconds", _ptr),
        ("hidden", _ptr),
    ]


def layout() -> list[int]:
    """These mirrors' layouts as ``dg_step_args_layout`` reports the C structs': per struct
    (StepArgs, Plan, Rope) its size, then per field its offset and size."""
    values: list[int] = []
    for struct in (StepArgs, Plan, Rope):
        values.append(ctypes.sizeof(struct))
        for field in struct._fields_:
            values += [getattr(struct, field[0]).offset, ctypes.sizeof(field[1])]
    return values
