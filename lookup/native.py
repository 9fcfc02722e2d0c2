"""The compiled tree proposal (``tree.cpp``): built with g++ at first use, cached per
machine, called through ctypes once per tree proposal. Without a compiler (or without the
Python and numpy headers it is built against) the drafter proposes trees in Python, with
identical results.

The library is loaded as a ``ctypes.PyDLL``: a call keeps the GIL, which it needs (it reads
the drafter's tracks and returns numpy arrays through the C APIs). A proposal takes a few
microseconds; releasing the GIL around it (``ctypes.CDLL``) let any other busy Python
thread (the gateway's event loop) take it, and the proposal then waited up to the
interpreter's switch interval (5 ms) to get it back."""

from __future__ import annotations

import ctypes
import os
import platform
import sysconfig
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lookup.acceptance import BUCKET_EDGES, BUCKET_OF
from lookup.draft import Source
from lookup.index import TokenIndex
from lookup.shared_library import build, load
from lookup.tracks import Track

SOURCE = Path(__file__).with_name("tree.cpp")
DISABLE_ENV = "DRAFTGATE_NO_NATIVE_TREES"  # set (non-empty): trees are built in Python
INCLUDES = [f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}"]
CFLAGS = ["-O2", "-ffp-contract=off", "-std=c++17", "-fPIC", *INCLUDES]
# what else the library depends on: the interpreter's and numpy's ABIs
MACHINE = [platform.machine(), str(sysconfig.get_config_var("EXT_SUFFIX")), np.__version__]

HEADER = 7  # kHeaderSlots: tracks, prompt length, rates, buckets, bucket_of, its length, candidates
TRACK_SLOTS = 6  # kTrackSlots: static, its length, tail, its length, source, context

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
    path, reason = build(SOURCE, CFLAGS, MACHINE)
    if path is None:
        return None, reason
    try:
        library = load(path, ctypes.PyDLL)  # keeps the GIL (see the module docstring)
    except OSError as exc:
        return None, f"loading failed: {exc}"
    library.dg_init.restype = ctypes.c_int
    library.dg_propose.argtypes = [ctypes.py_object]  # one tuple: ctypes converts no ints
    library.dg_propose.restype = ctypes.py_object
    try:
        failed = library.dg_init() != 0
    except Exception as exc:  # numpy's C API did not load (raised from the call)
        return None, f"initialisation failed: {exc}"
    return (None, "initialisation failed") if failed else (library, "")


def address(array: np.ndarray) -> int:
    """The address of a contiguous array's first element."""
    return int(array.ctypes.data)


RATE_BUCKETS = len(BUCKET_EDGES) + 1  # columns of the acceptance rates
_BUCKET_OF = np.asarray(BUCKET_OF, np.int64)


def drafter_block(
    tracks: Sequence[Track],
    context: TokenIndex,
    n_prompt: int,
    rates: np.ndarray,
    candidates: int,
) -> np.ndarray:
    """The int64 block ``dg_propose`` reads a drafter from (see tree.cpp), written once: the
    rates (float64 [source, bucket], C-contiguous, updated in place), each track's tokens
    (only the context may be appended to later: its tail is passed with each call)."""
    block = np.zeros(HEADER + TRACK_SLOTS * len(tracks), np.int64)
    block[:HEADER] = (
        len(tracks),
        n_prompt,
        writable_address(rates),
        RATE_BUCKETS,
        address(_BUCKET_OF),
        len(_BUCKET_OF),
        candidates,
    )
    for i, track in enumerate(tracks):
        start = HEADER + TRACK_SLOTS * i
        is_context = track.index is context
        source = Source.PROMPT if is_context else track.source
        block[start : start + TRACK_SLOTS] = (*track.index.addresses(), source, is_context)
    return block


def writable_address(array: np.ndarray) -> int:
    """:func:`address` of a writable array, cheaper."""
    return ctypes.addressof(ctypes.c_char.from_buffer(array.data))
