"""The compiled tree builder (``tree.cpp``): built with g++ at first use, cached per
machine, called through ctypes with one pointer. Without a compiler the drafter builds
trees in Python, with identical results."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lookup.acceptance import BUCKET_OF

SOURCE = Path(__file__).with_name("tree.cpp")
CACHE_ENV = "DRAFTGATE_KERNEL_CACHE"  # build directory root (default ~/.cache/draftgate)
DISABLE_ENV = "DRAFTGATE_NO_NATIVE_TREES"  # set (non-empty): trees are built in Python
CFLAGS = ["-O2", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared"]
MAX_CANDIDATES = 8  # kMaxCandidates in tree.cpp

HEADER = 12  # kHeaderSlots: addresses and sizes, then count, max nodes, max width
SLOTS = 8  # kCandidateSlots: static, its length, tail, its length, pos, periodic, source, match

_loaded: tuple[ctypes.CDLL | None, str] | None = None
_lock = threading.Lock()


def _library_path(compiler: str) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join([compiler, *CFLAGS, platform.machine()]).encode())
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "draftgate")
    return root / "kernels" / f"tree-{digest.hexdigest()[:16]}.so"


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
    compiler = os.environ.get("CXX") or shutil.which("g++") or ""
    if not compiler:
        return None, "no C++ compiler (g++ or $CXX)"
    target = _library_path(compiler)
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                run = subprocess.run(
                    [compiler, *CFLAGS, str(SOURCE), "-o", str(built)],
                    capture_output=True,
                    text=True,
                )
                if run.returncode != 0:
                    return None, f"build failed: {run.stderr.strip().splitlines()[-1:]}"
                built.replace(target)  # atomic: concurrent builders never load a partial file
        library = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"build failed: {exc}"
    library.dg_tree.argtypes = [ctypes.c_void_p]
    library.dg_tree.restype = ctypes.c_int64
    return library, ""


def address(array: np.ndarray) -> int:
    """The address of a contiguous array's first element."""
    return int(array.ctypes.data)


_BUCKET_OF = np.asarray(BUCKET_OF, np.int64)
_BUCKET_OF_ADDRESS = address(_BUCKET_OF)
_INTS = HEADER + SLOTS * MAX_CANDIDATES  # int64 slots of the block
_FIXED = HEADER - 3  # slots set once per buffer (the rest are set per call)
_PACKERS: dict[int, Callable[..., None]] = {}  # writers of the per-call slots, by length


def _packer(slots: int) -> Callable[..., None]:
    pack = _PACKERS[slots] = struct.Struct(f"={3 + slots}q").pack_into
    return pack


class TreeBuilder:
    """One drafter's calls into the compiled builder: the parameter block and the output
    arrays in one buffer, allocated once (grown for larger drafts); used from one thread."""

    def __init__(self, library: ctypes.CDLL, rates: np.ndarray, capacity: int = 64) -> None:
        """``rates``: the acceptance rates (float64 [source, bucket], C-contiguous), which
        must stay alive and may change in place between calls."""
        if rates.dtype != np.float64 or not rates.flags.c_contiguous:
            raise ValueError("rates must be C-contiguous float64")
        self._call = library.dg_tree
        self._rates = rates
        self._rates_address = address(rates)
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        """One buffer: the block, then tokens and match (int64), scores (float32), parents
        (int32), sources (int8)."""
        ints = _INTS + 2 * capacity  # 8-byte entries up to the scores
        buffer = np.zeros(8 * ints + 9 * capacity, np.uint8)
        self._buffer, base, self.capacity = buffer, address(buffer), capacity
        self._pointer = base  # the block comes first
        whole = buffer[: 8 * ints].view(np.int64)
        self._block = whole[:_INTS]
        self.tokens = whole[_INTS : _INTS + capacity]
        self.match = whole[_INTS + capacity :]
        floats = 8 * ints
        self.scores = buffer[floats : floats + 4 * capacity].view(np.float32)
        self.parents = buffer[floats + 4 * capacity : floats + 8 * capacity].view(np.int32)
        self.sources = buffer[floats + 8 * capacity :].view(np.int8)
        self._block[:_FIXED] = (
            self._rates_address,
            self._rates.shape[1],
            _BUCKET_OF_ADDRESS,
            len(_BUCKET_OF),
            base + 8 * _INTS,
            base + floats + 4 * capacity,
            base + floats,
            base + floats + 8 * capacity,
            base + 8 * (_INTS + capacity),
        )

    def build(self, max_nodes: int, max_width: int, slots: list[int]) -> int:
        """Put the draft in the first n entries of ``tokens``, ``parents``, ``scores``,
        ``sources`` and ``match``; returns n. ``slots``: ``SLOTS`` values per candidate (at
        most ``MAX_CANDIDATES``, see tree.cpp)."""
        if max_nodes > self.capacity:
            self._allocate(max(max_nodes, 2 * self.capacity))
        pack = _PACKERS.get(len(slots)) or _packer(len(slots))
        pack(self._buffer, 8 * _FIXED, len(slots) // SLOTS, max_nodes, max_width, *slots)
        n: int = self._call(self._pointer)
        return n
