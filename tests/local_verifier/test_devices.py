"""The target's default precision and the CPU flags it is chosen by."""

import threading

import pytest
import torch

import local_verifier.devices
from local_verifier.devices import (
    blocks_by_default,
    configure_threads,
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


class _TimedWork:
    """A workload whose run costs ``seconds[threads]`` on a clock of its own."""

    def __init__(self, seconds: dict[int, float]) -> None:
        self.seconds = seconds
        self.now = 0.0
        self.runs: dict[int, int] = {}

    def __call__(self) -> None:
        threads = torch.get_num_threads()
        self.runs[threads] = self.runs.get(threads, 0) + 1
        self.now += self.seconds[threads]

    def clock(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "chosen", "runs"),
    [
        ({2: 0.01, 1: 0.018}, 2, {2: 1 + 2 * 3, 1: 1 + 2 * 3}),  # small: 3 runs a timing
        ({2: 0.4, 1: 0.3}, 1, {2: 1 + 2 * 1, 1: 1 + 2 * 1}),  # a 1B model, busy machine: 1
        ({2: 0.1, 1: 0.19}, 2, {2: 1 + 2 * 3, 1: 1 + 2 * 2}),  # until 0.25 s have passed
    ],
)
def test_the_thread_probe_takes_the_faster_count_timing_long_runs_once(
    monkeypatch: pytest.MonkeyPatch, seconds: dict[int, float], chosen: int, runs: dict[int, int]
) -> None:
    monkeypatch.setattr(local_verifier.devices, "available_cpus", lambda: 2)
    work = _TimedWork(seconds)
    before = torch.get_num_threads()
    try:
        assert configure_threads(work, clock=work.clock) == chosen
        assert torch.get_num_threads() == chosen
    finally:
        torch.set_num_threads(before)
    assert work.runs == runs  # one untimed run of each count, then two timings
