"""The target's default precision and the CPU flags it is chosen by."""

import threading

import pytest
import torch

from local_verifier.devices import (
    blocks_by_default,
    cpu_flags,
    default_dtype,
    on_own_thread,
    resolve_dtype,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "fma"}, torch.float32),
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, torch.bfloat16),
        ({"avx512f", "amx_tile", "amx_bf16"}, torch.bfloat16),
        (set(), torch.float32),
    ],
)
def test_cpu_default_is_bf16_only_with_native_bf16(flags: set[str], expected: torch.dtype) -> None:
    assert default_dtype(CPU, flags) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "fma"}, True),
        ({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"}, True),
        ({"avx2", "avx512f", "amx_tile", "amx_int8", "amx_bf16"}, True),
        ({"sse4_2"}, False),
    ],
)
def test_gguf_blocks_are_the_default_on_avx2_avx512_and_amx(
    flags: set[str], expected: bool
) -> None:
    assert blocks_by_default(flags) is expected


def test_cuda_default_is_bf16_whatever_the_cpu() -> None:
    assert default_dtype(torch.device("cuda"), set()) == torch.bfloat16


def test_resolve_dtype_defaults_to_this_cpu_and_takes_names() -> None:
    native = bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    assert resolve_dtype(None, CPU) == (torch.bfloat16 if native else torch.float32)
    assert resolve_dtype("fp32", CPU) == torch.float32
    assert resolve_dtype("BF16", CPU) == torch.bfloat16
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        resolve_dtype("int8", CPU)


def test_on_own_thread_runs_work_on_a_thread_that_ends_with_it() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 7

    assert on_own_thread(work) == 7
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()


def test_on_own_thread_reraises_the_work_s_error() -> None:
    def work() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        on_own_thread(work)
