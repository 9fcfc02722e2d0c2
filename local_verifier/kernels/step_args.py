"""The argument struct of ``dg_stack_step``: the ctypes mirror of ``DgStepArgs``
(``cpu/stack.h``), field for field in the same order and of the same C types."""

from __future__ import annotations

import ctypes

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


class StepArgs(ctypes.Structure):
    """One fused step's inputs and outputs: addresses of contiguous tensors (None: a null
    pointer) and their sizes. See ``DgStepArgs`` for what each field holds."""

    _fields_ = [
        ("x", _ptr),
        ("cos", _ptr),
        ("sin", _ptr),
        ("new_slots", _ptr),
        ("n_rows", _i64),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
        ("n_slots", _i64),
        ("keys", _ptr),
        ("key_start", _ptr),
        ("row_start", _ptr),
        ("ctx_len", _ptr),
        ("masks", _ptr),
        ("mask_start", _ptr),
        ("n_seqs", _i64),
        ("picked", _ptr),
        ("n_picked", _i64),
        ("logits", _ptr),
        ("threads", ctypes.c_int),
        ("seconds", _ptr),
    ]


def layout() -> list[int]:
    """This mirror's layout as ``dg_step_args_layout`` reports the C struct's: its size, then
    per field its offset and size."""
    values = [ctypes.sizeof(StepArgs)]
    for field in StepArgs._fields_:
        values += [getattr(StepArgs, field[0]).offset, ctypes.sizeof(field[1])]
    return values
