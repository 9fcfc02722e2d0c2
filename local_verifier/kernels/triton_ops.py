"""The step's row-wise operations on the fixed-order Triton kernels (``triton_kernels``).

``TritonOps`` is a ``StepOps``: the op-by-op path any model family composes from, plus the
fused forms the Llama-family layer uses (a residual add in the linear's epilogue, the
SiLU-mul in the gate/up projection's, the residual add inside the norm). Outputs are in the
activations' dtype; every reduction runs in float32.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from local_verifier.kernels import triton_kernels as tk
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kv_storage import KEY_TILE


def _widen(x: torch.Tensor) -> bool:
    """Whether a product's bf16 operands are widened before the dot: under the interpreter
    (CPU tensors), whose dot takes no bf16. Products of bf16 values are exact in float32."""
    return x.device.type != "cuda" and x.dtype == torch.bfloat16


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class KeyLists:
    """Every row's key list on the device: ``keys[start[r] : start[r] + length[r]]``."""

    def __init__(self, keys: torch.Tensor, start: torch.Tensor, length: torch.Tensor) -> None:
        self.keys, self.start, self.length = keys, start, length

    @classmethod
    def of(cls, plan: AttentionPlan, device: torch.device) -> KeyLists:
        joined, lengths = plan.row_key_lists(device)
        counts = torch.tensor(lengths, dtype=torch.int64)
        start = torch.zeros_like(counts)
        if len(lengths) > 1:
            start[1:] = counts.cumsum(0)[:-1]
        return cls(joined, start.to(device), counts.to(device))


class TritonOps:
    """Invariant step kernels in Triton."""

    name = "triton"

    def __init__(self) -> None:
        self._steps = threading.local()  # per engine thread: its step's plan and key lists

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T (+ bias) (+ residual)``."""
        x = x.contiguous()
        m, k = x.shape
        n = weight.shape[0]
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        if m == 0:
            return out
        res = residual.contiguous() if residual is not None else out
        grid = (triton_cdiv(m, tk.TILE_ROWS), triton_cdiv(n, tk.BLOCK_N))
        tk.linear_kernel[grid](
            x, weight, bias if bias is not None else weight, res, out,
            m, n, k, x.stride(0), weight.stride(0), res.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, WIDEN=_widen(x),
            BM=tk.TILE_ROWS, BN=tk.BLOCK_N, BK=tk.BLOCK_K, num_warps=tk.NUM_WARPS,
        )  # fmt: skip
        return out

    def linear_silu_mul(self, x: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        """``silu(x @ gate.T) * (x @ up.T)`` for ``w13 = [gate; up]``."""
        x = x.contiguous()
        m, k = x.shape
        hidden = w13.shape[0] // 2
        out = torch.empty(m, hidden, dtype=x.dtype, device=x.device)
        if m == 0:
            return out
        grid = (triton_cdiv(m, tk.TILE_ROWS), triton_cdiv(hidden, tk.BLOCK_N))
        tk.linear_silu_mul_kernel[grid](
            x, w13, out, m, hidden, k, x.stride(0), w13.stride(0), out.stride(0),
            WIDEN=_widen(x), BM=tk.TILE_ROWS, BN=tk.BLOCK_N, BK=tk.BLOCK_K, num_warps=tk.NUM_WARPS,
        )  # fmt: skip
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.add_rms_norm(x, None, weight, eps)[0]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm of ``x + residual``, ``x + residual``); without a residual, (norm of x, x)."""
        x = x.contiguous()
        m, n = x.shape
        out = torch.empty_like(x)
        total = torch.empty_like(x) if residual is not None else x
        if m == 0:
            return out, total
        res = residual.contiguous() if residual is not None else x
        tk.rms_norm_kernel[(m,)](
            x, res, weight, out, total, n, eps, x.stride(0), res.stride(0), out.stride(0),
            HAS_RES=residual is not None, BLOCK=_p2(n), num_warps=tk.NUM_WARPS,
        )  # fmt: skip
        return out, total

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
        qkv = qkv.contiguous()
        n, dim = qkv.shape[0], cos.shape[-1]
        q = torch.empty(n, n_heads, dim, dtype=qkv.dtype, device=qkv.device)
        if n == 0:
            return q
        tk.rope_store_kernel[(n,)](
            qkv, cos.contiguous(), sin.contiguous(), new_slots, k_cache, v_cache, q,
            qkv.stride(0), N_HEADS=n_heads, N_KV=n_kv_heads, D=dim, KEY_TILE=KEY_TILE,
            HEADS_P2=_p2(n_heads + n_kv_heads), num_warps=tk.NUM_WARPS,
        )  # fmt: skip
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        hidden = gate_up.shape[1] // 2  # element-wise: a row's result is its own
        return F.silu(gate_up[:, :hidden]) * gate_up[:, hidden:]

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        hidden = gate_up.shape[1] // 2
        return F.gelu(gate_up[:, :hidden], approximate="tanh") * gate_up[:, hidden:]

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        last = getattr(self._steps, "last", None)
        if last is None or last[0] is not plan:  # built once per step, for every layer
            last = self._steps.last = (plan, KeyLists.of(plan, q.device))
        return self.attend(q, k_cache, v_cache, last[1])

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lists: KeyLists
    ) -> torch.Tensor:
        """Attention of every row over its own key list in ``lists``."""
        n, n_heads, dim = q.shape
        n_kv = v_cache.shape[-2]
        out = torch.empty_like(q)
        if n == 0:
            return out
        tk.attention_kernel[(n, n_kv)](
            q.contiguous(), k_cache, v_cache, lists.keys, lists.start, lists.length, out,
            1.0 / math.sqrt(dim), N_HEADS=n_heads, N_KV=n_kv, D=dim, KEY_TILE=KEY_TILE,
            GROUP_P2=_p2(n_heads // n_kv), BLOCK=tk.ATTN_KEYS, num_warps=tk.NUM_WARPS,
        )  # fmt: skip
        return out

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's greedy token (the lowest index of its largest logit), int32."""
        logits = logits.contiguous()
        rows, vocab = logits.shape
        out = torch.empty(rows, dtype=torch.int32, device=logits.device)
        if rows:
            tk.argmax_kernel[(rows,)](
                logits, out, vocab, logits.stride(0), BLOCK=1024, num_warps=tk.NUM_WARPS
            )
        return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
