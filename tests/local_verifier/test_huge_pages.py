"""Tests for local_verifier/huge_pages.py: zeros on 2 MiB-aligned anonymous memory."""

from __future__ import annotations

import mmap

import pytest
import torch

from local_verifier import huge_pages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_are_zero_writable_and_start_on_a_huge_page(dtype: torch.dtype) -> None:
    z = huge_pages.zeros((3, 1000, 7), dtype)
    assert z.shape == (3, 1000, 7) and z.dtype == dtype and z.is_contiguous()
    assert torch.equal(z, torch.zeros(3, 1000, 7, dtype=dtype))
    z[2, 999, 6] = 5
    assert z.sum().item() == 5
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert z.data_ptr() % huge_pages.HUGE_PAGE == 0


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="Linux only")
def test_zeros_are_resident_before_anything_writes_them() -> None:
    before = _resident_bytes()
    z = huge_pages.zeros((64, 1 << 20), torch.uint8)  # 64 MiB, never written here
    assert _resident_bytes() - before >= z.numel() * 0.95


def test_empty_shapes_fall_back_to_torch() -> None:
    assert huge_pages.zeros((0, 4), torch.float32).shape == (0, 4)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="Linux only")
def test_a_mapping_holds_the_size_from_its_huge_page_offset() -> None:
    mapped = huge_pages.huge_page_mapping(5 << 20)
    assert mapped is not None
    mapping, offset = mapped
    assert len(mapping) - offset >= 5 << 20
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    assert (address + offset) % huge_pages.HUGE_PAGE == 0
