"""The C++ step kernels (``step_cpu.cpp``, the entry points, with its parts in ``cpu/``: one
translation unit): compiled at first use, cached per machine kind and source, called through
ctypes on raw pointers of contiguous tensors."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path
from typing import Any

import torch

from local_verifier.devices import cpu_flags
from local_verifier.kernels import step_args
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import Layout, dense_shape, layout_of, quant_type
from local_verifier.kernels.plan import AttentionPlan
from lookup.shared_library import build, load

SOURCE = Path(__file__).with_name("step_cpu.cpp")
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-std=c++17", "-fPIC"]
# AVX2 + FMA at least; -march=native builds the AVX-512 kernels where the CPU has it
REQUIRED_CPU_FLAGS = ("avx2", "fma")
MAX_HEAD_DIM = 256

_i64, _f32, _int, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
SIGNATURES = {
    "dg_linear": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int],
    "dg_linear_bf16": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int],
    "dg_linear_packed": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int],
    "dg_linear_packed_bf16": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int],
    "dg_linear_quant": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int, _int],
    "dg_linear_quant_one_row": [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int, _int],
    "dg_bf16_kernels": [],
    "dg_release_threads": [],
    "dg_rms_norm": [_ptr, _ptr, _ptr, _i64, _i64, _f32],
    "dg_rope_store": [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "dg_rope_store_bf16": [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "dg_silu_mul": [_ptr, _ptr, _i64, _i64],
    "dg_gelu_tanh_mul": [_ptr, _ptr, _i64, _i64],
    "dg_attention": [_ptr] * 10 + [_i64] * 5 + [_int],
    "dg_attention_bf16": [_ptr] * 10 + [_i64] * 5 + [_int],
    "dg_stack_new": [_i64] * 7 + [_int, _ptr, _ptr, _ptr, _ptr],
    "dg_stack_free": [_ptr],
    "dg_stack_step": [_ptr, ctypes.POINTER(step_args.StepArgs)],
    "dg_step_args_layout": [ctypes.POINTER(_i64)],
}
AMX_SIGNATURES = {"dg_linear_amx": SIGNATURES["dg_linear_bf16"]}  # where dg_bf16_kernels
RESTYPES = {
    "dg_stack_new": _ptr,
    "dg_bf16_kernels": _int,
    "dg_step_args_layout": _i64,
    "dg_linear_quant": _int,
    "dg_linear_quant_one_row": _int,
}
BF16_KERNELS = {2: "amx", 1: "dot"}  # dg_bf16_kernels' codes: AMX tiles, AVX512-BF16 dots

_loaded: tuple[ctypes.CDLL | None, str] | None = None


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library, "") or (None, why it is unavailable). Loaded once per process."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded


def _load() -> tuple[ctypes.CDLL | None, str]:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None, f"needs Linux on x86-64, this is {platform.system()} {platform.machine()}"
    flags = cpu_flags()
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
    if missing:
        return None, f"the CPU lacks {', '.join(missing)}"
    return build_library(SOURCE)


def parts_of(source: Path) -> tuple[Path, ...]:
    """The parts a kernel source includes: every header in the ``cpu`` folder beside it."""
    return tuple(sorted(source.with_name("cpu").glob("*.h")))


def build_library(source: Path) -> tuple[ctypes.CDLL | None, str]:
    """The kernels compiled from ``source`` (and ``parts_of`` it) for this CPU and typed
    (``load_library`` loads this package's own; a benchmark may load another version beside
    it), or (None, why)."""
    path, reason = build(source, CFLAGS, sorted(cpu_flags()), parts_of(source))
    if path is None:
        return None, reason
    try:
        library = load(path, ctypes.CDLL)
    except OSError as exc:  # damaged or untrusted: the caller falls back to the torch kernels
        return None, f"{path.name} failed to load: {exc}"
    if not hasattr(library, "dg_step_args_layout"):  # a source from before DgStepArgs
        return None, f"{source.name}'s dg_stack_step does not take one DgStepArgs"
    typed = {**SIGNATURES, **(AMX_SIGNATURES if library.dg_bf16_kernels() else {})}
    for name, argtypes in typed.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = RESTYPES.get(name)
    expected = step_args.layout()
    layout = (ctypes.c_int64 * len(expected))()
    if library.dg_step_args_layout(layout) != len(expected) or list(layout) != expected:
        return None, f"{source.name}'s DgStepArgs is not step_args.StepArgs field for field"
    return library, ""


def release_threads() -> None:
    """Frees the calling thread's OpenMP team, torch's included (one runtime per process).

    The runtime keeps a team for every thread that has run a parallel region, for as long
    as the thread lives; once it manages more threads than there are CPUs it barely spins
    at a barrier, and each of a step's ~60 parallel regions waits for a wake-up. A model
    loaded on one thread (torch's parallel casts) left that thread a team, and the engine
    thread's 2-thread steps then ran at 1-thread speed (a 1-row fp32 step: 19.9 ms against
    10.2 on the loading thread; found as plain decode at about half speed in ``python -m
    benchmarks.bench_llamacpp --dtype float32``). A thread done with parallel work calls
    this; its next region builds a team again.
    """
    library, _ = load_library()
    if library is not None:
        library.dg_release_threads()


def _float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous float32 (a bf16 parameter widens exactly); ``t`` itself if it is."""
    if t.dtype == torch.float32 and t.is_contiguous():
        return t
    return t.to(torch.float32).contiguous()


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def output_tensor(out: torch.Tensor | None, n: int, m: int) -> torch.Tensor:
    """``out`` where given (checked: float32 [n, m], contiguous), else a new such tensor."""
    if out is None:
        return torch.empty(n, m)
    if out.shape != (n, m) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"a kernel's output is float32 [{n}, {m}], contiguous")
    return out


class CppOps:
    """The C++ kernels on float32 CPU activations; linear weights in float32 or bfloat16
    (widened exactly inside the kernel, so the bytes read per token halve), row-major or
    packed (``kernels.packing``: bitwise the same y); or bfloat16 in the ``amx`` layout,
    for the bf16 kernels (inputs rounded to bfloat16: AMX tiles, else AVX512-BF16 dot
    products) on CPUs that have either; or GGUF quantized blocks (``quant``: inputs
    quantized per block of 32, integer dot products). The K/V storage is float32 or bfloat16 (each value
    rounded to nearest even as it is stored, widened exactly as it is read)."""

    name = "cpp"

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self.bf16_kernels = BF16_KERNELS.get(library.dg_bf16_kernels())  # or None: neither
        self._linear = {
            (torch.float32, "row"): library.dg_linear,
            (torch.bfloat16, "row"): library.dg_linear_bf16,
            (torch.float32, "packed"): library.dg_linear_packed,
            (torch.bfloat16, "packed"): library.dg_linear_packed_bf16,
        }
        if self.bf16_kernels is not None:
            self._linear[torch.bfloat16, "amx"] = library.dg_linear_amx
        self._rope_store = {
            torch.float32: library.dg_rope_store,
            torch.bfloat16: library.dg_rope_store_bf16,
        }
        self._attention = {
            torch.float32: library.dg_attention,
            torch.bfloat16: library.dg_attention_bf16,
        }

    def weight_layout(self, options: KernelOptions) -> Layout:
        """The layout linear weights take for these kernels under ``options`` (where a weight
        can: ``packing.packable``): ``row`` unless ``options.packed``; ``amx`` for the bf16
        kernels where this process runs them (``bf16_kernels``: AMX tiles, or AVX512-BF16
        dot products where AMX is absent or not granted) and ``options.amx``; else ``packed``."""
        if not options.packed:
            return "row"
        return "amx" if self.bf16_kernels is not None and options.amx else "packed"

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T + bias`` as float32, into ``out`` where given (float32 [n, m],
        contiguous)."""
        if layout_of(weight) == "quant":
            return self._quant_linear(x, weight, bias, out)
        kernel = self._linear.get((weight.dtype, layout_of(weight)))
        if kernel is None:
            raise TypeError(f"no C++ linear kernel for {weight.dtype} in {layout_of(weight)}")
        x, w = _dense(x), _dense(weight)
        (n, k), m = x.shape, dense_shape(w)[0]
        y = output_tensor(out, n, m)
        b = None if bias is None else _float32(bias)  # alive for the call
        b_ptr = None if b is None else b.data_ptr()
        kernel(x.data_ptr(), w.data_ptr(), b_ptr, y.data_ptr(), n, k, m, torch.get_num_threads())
        return y

    def _quant_linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """``linear`` on GGUF blocks (``cpu/quant.h``: x quantized per block of 32)."""
        x, w = _float32(x), _dense(weight)
        (n, k), (m, width) = x.shape, dense_shape(w)
        if k != width:  # the kernel reads k values of blocks per weight row
            raise ValueError(f"a linear of {width} inputs got rows of {k}")
        y, b = output_tensor(out, n, m), None if bias is None else _float32(bias)
        b_ptr = None if b is None else b.data_ptr()
        qtype = int(quant_type(w))
        threads = torch.get_num_threads()
        if self.library.dg_linear_quant(x.data_ptr(), w.data_ptr(), b_ptr, y.data_ptr(), n, k, m, qtype, threads):  # fmt: skip
            raise TypeError(f"no C++ kernel for {quant_type(w).name} blocks over {k} values")
        return y

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = _dense(x)
        y, w = torch.empty_like(x), _float32(weight)
        self.library.dg_rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), *x.shape, eps)
        return y

    def rope_store(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        new_slots: torch.Tensor,
        n_heads: int,
        n_kv_heads: int,
    ) -> torch.Tensor:
        n, dim = qkv.shape[0], cos.shape[1]
        q = torch.empty(n, n_heads, dim)
        slots, cos, sin = _dense(new_slots), _dense(cos), _dense(sin)
        _kernel(self._rope_store, k_cache, v_cache)(
            qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
            v_cache.data_ptr(), slots.data_ptr(), q.data_ptr(), n, n_heads, n_kv_heads, dim,
        )  # fmt: skip
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        n, hidden = gate_up.shape[0], gate_up.shape[1] // 2
        y = torch.empty(n, hidden)
        self.library.dg_silu_mul(gate_up.data_ptr(), y.data_ptr(), n, hidden)
        return y

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        n, hidden = gate_up.shape[0], gate_up.shape[1] // 2
        y = torch.empty(n, hidden)
        self.library.dg_gelu_tanh_mul(gate_up.data_ptr(), y.data_ptr(), n, hidden)
        return y

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        n, heads, dim = q.shape
        kv_heads = v_cache.shape[1]
        if dim > MAX_HEAD_DIM:
            raise ValueError(f"C++ attention needs head_dim <= {MAX_HEAD_DIM}")
        out = torch.empty_like(q)
        _kernel(self._attention, k_cache, v_cache)(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), *plan.pointers(), out.data_ptr(),
            n, len(plan.ctx_len), heads, kv_heads, dim, torch.get_num_threads(),
        )  # fmt: skip
        return out


def _kernel(kernels: dict[torch.dtype, Any], k_cache: torch.Tensor, v_cache: torch.Tensor) -> Any:
    """The kernel of ``kernels`` for the K/V storage's dtype."""
    kernel = kernels.get(k_cache.dtype)
    if kernel is None or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"no C++ kernel for K/V in {k_cache.dtype} and {v_cache.dtype}")
    return kernel
