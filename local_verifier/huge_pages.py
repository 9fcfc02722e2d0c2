"""Anonymous memory on transparent huge pages (Linux) for what a step streams or scatters
over: packed weights (one TLB miss per 4 KiB page of a 1-row step's stream otherwise) and
the K/V pool (a sequence's slots lie in blocks scattered over it)."""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 << 20
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14 and later


def huge_page_mapping(size: int) -> tuple[mmap.mmap, int] | None:
    """A private anonymous mapping that holds ``size`` bytes from a huge page boundary (the
    mapping, that boundary's offset in it), advised onto transparent huge pages; None where
    the OS has no such advice. Pages are committed, zero, as they are first written."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return mapping, -address % HUGE_PAGE


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """CPU zeros of ``shape`` on huge pages where the OS has them (else ``torch.zeros``),
    committed now: a page first written by a forward step would stall it (the kernel zeroes
    2 MiB, and on a VM the host faults the memory in first: populating 256 MiB took 0.62 s
    on a fresh mapping against 0.03 s on one used before; benchmarks/RESULTS.md, "First
    touch of memory on a VM")."""
    nbytes = math.prod(shape) * dtype.itemsize
    mapped = huge_page_mapping(nbytes) if nbytes else None
    if mapped is None:
        return torch.zeros(shape, dtype=dtype)
    mapping, offset = mapped
    flat = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)
    try:
        mapping.madvise(MADV_POPULATE_WRITE)  # faults every page in, writes nothing
    except OSError:  # an older kernel: one write per page
        flat[:: mmap.PAGESIZE].zero_()
    return flat.view(dtype).view(shape)  # the tensor keeps the mapping alive
