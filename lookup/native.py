"""The compiled tree builder (``tree.cpp``): built with g++ at first use, cached per
machine, called through ctypes with one pointer. Without a compiler the drafter builds
trees in Python, with identical results.

The library is loaded as a ``ctypes.PyDLL``: a call keeps the GIL. A build takes a few
microseconds; releasing the GIL around it (``ctypes.CDLL``) let any other busy Python
thread (the gateway's event loop) take it, and the proposal then waited up to the
interpreter's switch interval (5 ms) to get it back."""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lookup.acceptance import BUCKET_EDGES, BUCKET_OF
from lookup.shared_library import build

SOURCE = Path(__file__).with_name("tree.cpp")
DISABLE_ENV = "DRAFTGATE_NO_NATIVE_TREES"  # set (non-empty): trees are built in Python
CFLAGS = ["-O2", "-ffp-contract=off", "-std=c++17", "-fPIC"]
MAX_CANDIDATES = 8  # kMaxCandidates in tree.cpp

HEADER = 12  # kHeaderSlots: sizes and output addresses, then rates, count, max nodes, width
SLOTS = 8  # kCandidateSlots: static, its length, tail, its length, pos, periodic, source, match

_loaded: tuple[ctypes.CDLL | None, str] | None = None
_lock = threading.Lock()


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library, "") or (None, why it is unavailable). Built once per machine,
    loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get(DISABLE_ENV):
        return None, f"disabled by {DISABLE_ENV}"
    path, reason = build(SOURCE, CFLAGS, [platform.machine()])
    if path is None:
        return None, reason
    try:
        library = ctypes.PyDLL(str(path))  # keeps the GIL (see the module docstring)
    except OSError as exc:
        return None, f"loading failed: {exc}"
    library.dg_tree.argtypes = [ctypes.c_void_p]
    library.dg_tree.restype = ctypes.c_int64
    return library, ""


def address(array: np.ndarray) -> int:
    """The address of a contiguous array's first element."""
    return int(array.ctypes.data)


RATE_BUCKETS = len(BUCKET_EDGES) + 1  # columns of the acceptance rates
_BUCKET_OF = np.asarray(BUCKET_OF, np.int64)
_BUCKET_OF_ADDRESS = address(_BUCKET_OF)
_INTS = HEADER + SLOTS * MAX_CANDIDATES  # int64 slots of the block
_FIXED = HEADER - 4  # slots set once per buffer (the rest are set per call)
_PACKERS: dict[int, Callable[..., None]] = {}  # writers of the per-call slots, by length


def _packer(slots: int) -> Callable[..., None]:
    pack = _PACKERS[slots] = struct.Struct(f"={4 + slots}q").pack_into
    return pack


class TreeBuilder:
    """Calls into the compiled builder: the parameter block and the output arrays in one
    buffer, allocated once (grown for larger drafts). One per thread (:func:`tree_builder`)."""

    def __init__(self, library: ctypes.CDLL, capacity: int = 64) -> None:
        self._call = library.dg_tree
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        """One buffer: the block, then tokens and match (int64), scores (float32), parents
        (int32), sources (int8)."""
        ints = _INTS + 2 * capacity  # 8-byte entries up to the scores
        buffer = np.zeros(8 * ints + 9 * capacity, np.uint8)
        self._buffer, base, self.capacity = buffer, address(buffer), capacity
        self._pointer = base  # the block comes first
        whole = buffer[: 8 * ints].view(np.int64)
        self.tokens = whole[_INTS : _INTS + capacity]
        self.match = whole[_INTS + capacity :]
        floats = 8 * ints
        self.scores = buffer[floats : floats + 4 * capacity].view(np.float32)
        self.parents = buffer[floats + 4 * capacity : floats + 8 * capacity].view(np.int32)
        self.sources = buffer[floats + 8 * capacity :].view(np.int8)
        whole[:_FIXED] = (
            RATE_BUCKETS,
            _BUCKET_OF_ADDRESS,
            len(_BUCKET_OF),
            base + 8 * _INTS,
            base + floats + 4 * capacity,
            base + floats,
            base + floats + 8 * capacity,
            base + 8 * (_INTS + capacity),
        )

    def build(self, rates: int, max_nodes: int, max_width: int, slots: list[int]) -> int:
        """Put the draft in the first n entries of ``tokens``, ``parents``, ``scores``,
        ``sources`` and ``match``; returns n. ``rates``: the address of the acceptance rates
        (float64 [source, bucket], C-contiguous); ``slots``: ``SLOTS`` values per candidate
        (at most ``MAX_CANDIDATES``, see tree.cpp)."""
        if max_nodes > self.capacity:
            self._allocate(max(max_nodes, 2 * self.capacity))
        pack = _PACKERS.get(len(slots)) or _packer(len(slots))
        pack(self._buffer, 8 * _FIXED, rates, len(slots) // SLOTS, max_nodes, max_width, *slots)
        n: int = self._call(self._pointer)
        return n


_local = threading.local()


def tree_builder() -> TreeBuilder | None:
    """This thread's builder, or None when the library is unavailable."""
    builder: TreeBuilder | None = getattr(_local, "builder", None)
    if builder is None:
        library, _ = load_library()
        if library is None:
            return None
        builder = _local.builder = TreeBuilder(library)
    return builder


def writable_address(array: np.ndarray) -> int:
    """:func:`address` of a writable array, cheaper."""
    return ctypes.addressof(ctypes.c_char.from_buffer(array.data))
