"""The generic decoder (the Llama layer and the switches of ``ModelConfig``) stepping many
sequences at once; the families (``local_verifier.families``) map checkpoints onto it.

``Transformer.step`` runs one forward over the new rows of several sequences (prompt chunks,
decode rows, draft chains and trees) against a shared ``KVStorage``; it is the only forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from local_verifier.config import ModelConfig
from local_verifier.families import tensor_names
from local_verifier.kernels import AttentionPlan, StepOps, step_ops
from local_verifier.kernels.cpp import CppOps
from local_verifier.kernels.fused import FusedStack
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import Layout, dense_shape, gather_rows
from local_verifier.kernels.stack_weights import LayerWeights, Norm, StackWeights
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import RUNS, Linear, row_major_state, split_runs
from local_verifier.logit_buffers import LogitBuffers
from local_verifier.rope import rope_tables
from local_verifier.step_logits import LOGIT_ROWS, ChunkedLogits
from local_verifier.weights import TensorSource

if TYPE_CHECKING:
    from local_verifier.kernels.triton_stack import StepGraphs

__all__ = ["ModelConfig", "SeqStep", "Transformer"]


@dataclass
class SeqStep:
    """One sequence's new rows in a forward step.

    Row i attends to all of ``context_slots`` (in order), then to the new rows j with
    ``mask[i, j]`` (in row order; ``mask[i, i]`` must be True). ``mask=None`` is causal.
    """

    tokens: torch.Tensor  # long [T]
    positions: torch.Tensor  # long [T]: rope position (prefix length + depth for trees)
    new_slots: torch.Tensor  # long [T]: slots the rows' K/V go to (no slot twice in a step)
    context_slots: torch.Tensor  # long [C]: committed slots the rows attend to, in order
    mask: torch.Tensor | None = None  # bool [T, T]: new row i may attend new row j
    logits: str = "all"  # which rows need logits


class RMSNorm(nn.Module):
    """Root-mean-square norm's weight and epsilon (applied by the step kernels in float32)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


@dataclass
class _StepInputs:
    """What every layer of one step shares."""

    ops: StepOps
    cos: torch.Tensor  # [N, head_dim]
    sin: torch.Tensor
    new_slots: torch.Tensor  # long [N]
    plan: AttentionPlan
    local_rope: tuple[torch.Tensor, torch.Tensor] | None = None  # sliding layers' cos, sin
    _windowed: dict[int, AttentionPlan] = field(default_factory=dict)

    def rope(self, local: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of a global (or, with ``local``, a sliding-window) layer."""
        return self.local_rope if local and self.local_rope else (self.cos, self.sin)

    def plan_for(self, window: int | None) -> AttentionPlan:
        """The plan of a layer attending to its rows' last ``window`` keys (None: all);
        built once per step and window."""
        if window is None:
            return self.plan
        if window not in self._windowed:
            self._windowed[window] = self.plan.windowed(window)
        return self._windowed[window]


class Attention(nn.Module):
    """Grouped-query attention with fused q/k/v projection."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.dim, q + 2 * kv, bias=cfg.qkv_bias)
        self.wo = Linear(q, cfg.dim)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.window = cfg.window(layer)
        self.local_rope = self.window is not None and cfg.rope_local_theta is not None
        # wqkv's q and k rows (and bias) in a GGUF llama file's pair order, used in place
        self.qk_pairs = False

    def forward(self, x: torch.Tensor, kv: KVStorage, step: _StepInputs) -> torch.Tensor:
        cfg, ops = self.cfg, step.ops
        keys, values = kv.k[self.layer], kv.v[self.layer]
        qkv = self.wqkv(x, ops)
        if self.qk_pairs:
            qkv = self._rotate_half_order(qkv)
        if cfg.qk_norm:
            qkv = self._norm_qk(qkv, ops)
        cos, sin = step.rope(self.local_rope)
        q = ops.rope_store(qkv, cos, sin, keys, values, step.new_slots, cfg.n_heads, cfg.n_kv_heads)
        out = ops.attention(q, keys, values, step.plan_for(self.window))
        return cast(torch.Tensor, self.wo(out.view(x.shape[0], -1), ops))

    def _rotate_half_order(self, qkv: torch.Tensor) -> torch.Tensor:
        """``qkv`` with each q and k head's values from the file's pair order (value
        ``2i + j`` rotated with ``2i + 1 - j``) in rotate-half order (at ``i + j half``): the
        values moved, none computed."""
        n, d = qkv.shape[0], self.cfg.head_dim
        k_end = (self.cfg.n_heads + self.cfg.n_kv_heads) * d
        heads = qkv[:, :k_end].reshape(n, -1, d // 2, 2).transpose(2, 3).reshape(n, k_end)
        return torch.cat([heads, qkv[:, k_end:]], dim=1)

    def _norm_qk(self, qkv: torch.Tensor, ops: StepOps) -> torch.Tensor:
        """``qkv`` with each query and key head RMS-normed (one row per head)."""
        n, d = qkv.shape[0], self.cfg.head_dim
        q_end = self.cfg.n_heads * d
        k_end = q_end + self.cfg.n_kv_heads * d
        q = ops.rms_norm(qkv[:, :q_end].reshape(-1, d), self.q_norm.weight, self.q_norm.eps)
        k = ops.rms_norm(qkv[:, q_end:k_end].reshape(-1, d), self.k_norm.weight, self.k_norm.eps)
        return torch.cat([q.view(n, -1), k.view(n, -1), qkv[:, k_end:]], dim=1)


class FeedForward(nn.Module):
    """SwiGLU (or GeGLU) MLP with fused gate/up projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim)
        self.w2 = Linear(cfg.hidden_dim, cfg.dim)
        self.gelu = cfg.activation == "gelu_tanh"

    def forward(self, x: torch.Tensor, ops: StepOps) -> torch.Tensor:
        gate_up = self.w13(x, ops)
        hidden = ops.gelu_tanh_mul(gate_up) if self.gelu else ops.silu_mul(gate_up)
        return cast(torch.Tensor, self.w2(hidden, ops))


class Block(nn.Module):
    """Pre-norm transformer block (with ``post_norms``, the attention's and the MLP's outputs
    normed too before the residual add)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)
        self.post_norms = cfg.post_norms
        if cfg.post_norms:
            self.post_attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.post_ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def layer_weights(self) -> LayerWeights:
        """The parameters as the fused steps read them (``Transformer.stack_weights``)."""
        _, k_run, v_run = self.attn.wqkv.runs_by_part(3)
        return LayerWeights(
            attn_norm=self.attn_norm.weight,
            attn_eps=self.attn_norm.eps,
            wqkv=self.attn.wqkv.weight,
            wqkv_k=k_run,
            wqkv_v=v_run,
            qk_pairs=self.attn.qk_pairs,
            bqkv=self.attn.wqkv.bias,
            wo=self.attn.wo.weight,
            ffn_norm=self.ffn_norm.weight,
            ffn_eps=self.ffn_norm.eps,
            w13=self.ffn.w13.weight,
            w13_up=self.ffn.w13.runs_by_part(2)[1],
            w2=self.ffn.w2.weight,
            q_norm=_norm(self.attn, "q_norm"),
            k_norm=_norm(self.attn, "k_norm"),
            post_attn_norm=_norm(self, "post_attn_norm"),
            post_ffn_norm=_norm(self, "post_ffn_norm"),
            activation="gelu_tanh" if self.ffn.gelu else "silu",
            window=self.attn.window,
            local_rope=self.attn.local_rope,
        )

    def forward(self, x: torch.Tensor, kv: KVStorage, step: _StepInputs) -> torch.Tensor:
        ops = step.ops
        h = self.attn(ops.rms_norm(x, self.attn_norm.weight, self.attn_norm.eps), kv, step)
        if self.post_norms:
            h = ops.rms_norm(h, self.post_attn_norm.weight, self.post_attn_norm.eps)
        x = x + h
        h = self.ffn(ops.rms_norm(x, self.ffn_norm.weight, self.ffn_norm.eps), ops)
        if self.post_norms:
            h = ops.rms_norm(h, self.post_ffn_norm.weight, self.post_ffn_norm.eps)
        out: torch.Tensor = x + h
        return out


def _norm(owner: nn.Module, name: str) -> Norm | None:
    """``owner``'s RMSNorm ``name`` as the fused steps read it, None where it has none."""
    norm = getattr(owner, name, None)
    return Norm(norm.weight, norm.eps) if isinstance(norm, RMSNorm) else None


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, without the copy for one part (a decode step's one sequence)."""
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


class Transformer(nn.Module):
    """Llama-family decoder: ``step(seqs, kv)`` over many sequences' rows at once."""

    def __init__(self, cfg: ModelConfig, positions: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.rope_positions = (
            cfg.max_seq_len if positions is None else min(positions, cfg.max_seq_len)
        )
        """The positions its rope tables cover: the config's context, or fewer
        (``load_model``'s ``max_seq_len`` and ``kv_cache_mb``)."""
        # given its (uninitialised) table: the default random init would import torch's
        # compiler stack on the meta device (over 100 MiB resident, for nothing)
        self.embed = nn.Embedding.from_pretrained(torch.empty(cfg.vocab_size, cfg.dim))
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = Linear(cfg.dim, cfg.vocab_size)
        if cfg.tie_embeddings:  # one tensor: the head's layout is the embedding's too
            self.head.weight = cast(nn.Parameter, self.embed.weight)
            row_major_state(self.embed)
        # plain attributes, not buffers: dtype casts of the module must not round them; on
        # the CPU also when the model is built on the meta device
        self.local_rope: tuple[torch.Tensor, torch.Tensor] | None = None
        with torch.device("cpu"):
            cpu = torch.device("cpu")
            self.rope_cos, self.rope_sin = rope_tables(cfg, cpu, self.rope_positions)
            if cfg.rope_local_theta is not None:  # sliding layers: their own base, no scaling
                local = replace(cfg, rope_theta=cfg.rope_local_theta, rope_scaling=None)
                self.local_rope = rope_tables(local, cpu, self.rope_positions)
        self._stack: tuple[FusedStack | None] | None = None  # built at first use
        self._graphs: StepGraphs | None = None  # the Triton step's, built at first use
        self._logit_buffers: LogitBuffers | None = None  # the CPU steps', at first use
        self._layout: Layout = "row"  # the linear weights' layout (where they can take it)
        self.kernel_options = KernelOptions.from_env()
        """The kernel switches, read once here; assign other options to change them (the
        next step repacks the weights and rebuilds the fused stack if they call for it)."""

    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> Transformer:
        """A model with random weights (std 0.02), for tests."""
        gen = torch.Generator().manual_seed(0)
        model = cls(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        return model.to(device=device, dtype=dtype).eval()

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def weight_dtype(self) -> torch.dtype:
        """The float parameters' dtype: the target's precision (float32, or bfloat16 for the
        bf16 target; a GGUF file's blocks, the embedding's among them, are uint8)."""
        return self.norm.weight.dtype

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the weights', except that bf16 weights on the CPU compute
        in float32 (the kernels widen each weight exactly as they read it)."""
        weights = self.weight_dtype
        return torch.float32 if weights == torch.bfloat16 and self.device.type == "cpu" else weights

    @property
    def kv_dtype(self) -> torch.dtype:
        """The K/V storage's dtype: the weights' (the bf16 target stores each K/V value
        rounded to bf16, on the CPU too, so a token's K/V take half the bytes)."""
        return self.weight_dtype

    def to(self, *args: Any, **kwargs: Any) -> Transformer:
        """Like ``nn.Module.to``; the float32 rope tables follow the device only."""
        super().to(*args, **kwargs)
        self.rope_cos = self.rope_cos.to(self.device)
        self.rope_sin = self.rope_sin.to(self.device)
        if self.local_rope is not None:
            self.local_rope = (
                self.local_rope[0].to(self.device),
                self.local_rope[1].to(self.device),
            )
        return self

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Transformer:
        self._stack = None  # casts and moves may replace the parameters the stack points to
        self._graphs = None
        self._set_layout("row")  # the next step packs what the new dtype and device call for
        super()._apply(fn, *args, **kwargs)
        return self

    def stack_weights(self) -> StackWeights:
        """The parameters and layer switches of this model as they are now, as both fused
        steps (the C++ stack, any family, and the Triton one, the Llama layer) read them."""
        cfg = self.config
        return StackWeights(
            embed=self.embed.weight,
            layers=[cast(Block, block).layer_weights() for block in self.layers],
            norm=self.norm.weight,
            norm_eps=self.norm.eps,
            head=self.head.weight,
            rope_cos=self.rope_cos,
            rope_sin=self.rope_sin,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads,
        )

    def fused_stack(self) -> FusedStack | None:
        """The C++ layer stack this model's steps run on now: None on the torch backend,
        with ``kernel_options.fused`` off or where it does not apply. Built once per parameter set."""
        ops = step_ops(self.device, self.dtype, self.kernel_options.backend)
        self._use_layout(ops)
        return self._fused(ops)

    def _use_layout(self, ops: StepOps) -> None:
        """Packs the linear weights for the C++ kernels (``CppOps.weight_layout`` under
        ``kernel_options``), row-major for the others: in place, one matrix at a time, so one
        copy stays resident."""
        self._set_layout(self._layout_for(ops))

    def _layout_for(self, ops: StepOps) -> Layout:
        """The linear weights' layout for the kernels of ``ops``."""
        return ops.weight_layout(self.kernel_options) if isinstance(ops, CppOps) else "row"

    def _set_layout(self, layout: Layout) -> None:
        if layout == self._layout:
            return
        self._stack = None  # it holds the old tensors
        for module in self.modules():
            if isinstance(module, Linear):
                module.set_layout(layout)
        self._layout = layout

    def _fused(self, ops: StepOps) -> FusedStack | None:
        if not isinstance(ops, CppOps) or not self.kernel_options.fused:
            return None
        if self._stack is None:
            self._stack = (FusedStack.build(ops.library, self.stack_weights()),)
        return self._stack[0]

    def _triton_graphs(self, ops: StepOps, kv: KVStorage) -> StepGraphs | None:
        """The Triton step of a Llama-family model over ``kv`` (None for other kernels or
        families, which run op by op); rebuilt when the K/V storage changes."""
        cfg = self.config
        if ops.name != "triton" or not cfg.llama_layers or cfg.embed_scale is not None:
            return None
        capture = self.kernel_options.graphs
        if self._graphs is None or self._graphs.k is not kv.k or self._graphs.capture != capture:
            from local_verifier.kernels.triton_stack import GRAPH_ROWS, StepGraphs, TritonStack

            stack = TritonStack(self.stack_weights(), cast(Any, ops))
            self._graphs = StepGraphs(stack, kv.k, kv.v, GRAPH_ROWS, self.rope_positions, capture)
        return self._graphs

    def step(self, seqs: Sequence[SeqStep], kv: KVStorage) -> list[torch.Tensor]:
        """One forward over every sequence's rows; returns per sequence float32 logits
        [T, V] ("all"), [1, V] ("last") or [0, V] ("none").

        Writes every row's K/V to its ``new_slots``, all distinct (rejected draft rows are
        simply overwritten later). See ``SeqStep`` for what a row attends to.
        """
        return list(self._step(seqs, kv, None))

    def step_chunked(
        self, seqs: Sequence[SeqStep], kv: KVStorage, max_rows: int
    ) -> Sequence[torch.Tensor]:
        """``step``, with at most about ``max_rows`` rows of logits held at a time on the CPU
        kernels: where the step picks more, the head runs on each chunk of sequences when
        its logits are first read (``ChunkedLogits``; read them in order). The same bits as
        ``step``'s."""
        return self._step(seqs, kv, max_rows)

    @torch.inference_mode()
    def _step(
        self, seqs: Sequence[SeqStep], kv: KVStorage, max_rows: int | None
    ) -> Sequence[torch.Tensor]:
        device, dtype = self.device, self.dtype
        ops = step_ops(device, dtype, self.kernel_options.backend)
        self._use_layout(ops)
        rows_in = (  # on the host; the Triton step copies them in one transfer of its own
            _joined([s.tokens for s in seqs]),
            _joined([s.positions for s in seqs]),
            _joined([s.new_slots for s in seqs]),
        )
        plan = AttentionPlan.build(
            [s.context_slots for s in seqs], [s.new_slots for s in seqs], [s.mask for s in seqs]
        )
        if kv.k.dtype != self.kv_dtype or kv.k.device != device:
            raise ValueError(
                f"the K/V storage holds {kv.k.dtype} on {kv.k.device}; this model's step "
                f"writes {self.kv_dtype} on {device}"
            )
        if plan.keys.numel():
            lowest, highest = (int(end) for end in plan.keys.aminmax())
            if not 0 <= lowest <= highest < kv.n_slots:
                raise IndexError(f"a slot outside the storage's {kv.n_slots} slots")
        if rows_in[1].numel():
            lowest, highest = (int(end) for end in rows_in[1].aminmax())
            if not 0 <= lowest <= highest < self.rope_positions:
                raise IndexError(f"a position outside the model's {self.rope_positions} positions")
        logit_rows: list[int] = []
        counts: list[int] = []
        start = 0
        for s in seqs:
            t = s.tokens.shape[0]
            rows = {
                "all": range(start, start + t),
                "last": range(start + t - 1, start + t),
                "none": range(0),
            }
            if s.logits not in rows:
                raise ValueError(f"logits must be 'all', 'last' or 'none', got {s.logits!r}")
            if s.mask is not None and not bool(s.mask.diagonal().all()):
                raise ValueError("a row's mask must allow the row itself (mask[i, i])")
            picked = rows[s.logits]
            logit_rows.extend(picked)
            counts.append(len(picked))
            start += t
        graphs = self._triton_graphs(ops, kv)
        if graphs is not None:  # the Triton step, padded to a row bucket (a CUDA graph)
            window = self.config.window(0)  # one window on every layer
            tokens, positions, new_slots = rows_in
            windowed = plan if window is None else plan.windowed(window)
            logits = graphs.run(tokens, positions, new_slots, windowed)
            wanted = torch.tensor(logit_rows, dtype=torch.long, device=device)
            return list(logits.index_select(0, wanted).split(counts))
        tokens, positions, new_slots = (t.to(device) for t in rows_in)
        inputs = _StepInputs(
            ops, self.rope_cos[positions], self.rope_sin[positions], new_slots, plan
        )
        if self.local_rope is not None:
            inputs.local_rope = (self.local_rope[0][positions], self.local_rope[1][positions])
        x = gather_rows(self.embed.weight, tokens).to(dtype)
        if self.config.embed_scale is not None:  # rounded to the weights' dtype, as HF does
            x = x * torch.tensor(self.config.embed_scale, dtype=self.weight_dtype, device=device)
        # rows of logits at a time where the head is left to the reader (None: all at once)
        chunk = max_rows if max_rows is not None and len(logit_rows) > max_rows else None
        chunk = chunk if device.type == "cpu" else None
        stack = self._fused(ops) if kv.k.is_contiguous() and kv.v.is_contiguous() else None
        if stack is not None:  # the same kernels in the same order, in one C++ call
            rows_out = torch.tensor(logit_rows, dtype=torch.long)
            ropes = [(inputs.cos, inputs.sin)]
            if stack.local_rope and inputs.local_rope is not None:
                ropes.append(inputs.local_rope)
            plans = [inputs.plan]
            if stack.window is not None:
                plans.append(inputs.plan_for(stack.window))
            buffer = self._logits(len(logit_rows)) if chunk is None else None
            out = stack.run(x, new_slots, ropes, plans, kv.k, kv.v, rows_out, chunk is None, buffer)
            if chunk is None:
                return list(out.split(counts))
            return ChunkedLogits(out, counts, partial(self._head, ops), chunk)
        for layer in self.layers:
            x = layer(x, kv, inputs)
        x = x[torch.tensor(logit_rows, dtype=torch.long, device=device)]
        x = ops.rms_norm(x, self.norm.weight, self.norm.eps)
        if chunk is None:
            return list(self._head(ops, x).split(counts))
        return ChunkedLogits(x, counts, partial(self._head, ops), chunk)

    @torch.inference_mode()
    def _head(self, ops: StepOps, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of final-normed rows ``x``."""
        if isinstance(ops, CppOps):
            return ops.linear(x, self.head.weight, None, self._logits(x.shape[0]))
        return ops.linear(x, self.head.weight, None).float()

    def _logits(self, rows: int) -> torch.Tensor:
        """Memory for ``rows`` rows of a CPU step's logits (``LogitBuffers``)."""
        if self._logit_buffers is None:
            self._logit_buffers = LogitBuffers(dense_shape(self.head.weight)[0], LOGIT_ROWS)
        return self._logit_buffers.empty(rows)

    def load_hf_weights(self, source: TensorSource) -> None:
        """Write the checkpoint's weights (under ``families.tensor_names``) into the
        parameters in place: a fused matrix's parts into its row slices, each tensor converted
        once into the parameter's dtype and device. A tied head is the embedding (the
        checkpoint's ``lm_head.weight``, if any, unread)."""
        own = dict(self.named_parameters())  # a tied head is listed once, as the embedding
        params: dict[str, list[str]] = {}
        for name in own:
            module, _, attr = name.rpartition(".")
            owner = self.get_submodule(module)
            run = RUNS.index(attr) if isinstance(owner, Linear) and attr in RUNS else None
            parts = tensor_names(self.config, name if run is None else f"{module}.weight")
            if parts is None:
                raise KeyError(f"no weights for {name!r}")
            if run is not None:
                parts = split_runs(parts, cast(Linear, owner).first_parts)[run]
            params[name] = parts
        layout = self._layout_for(step_ops(self.device, self.dtype, self.kernel_options.backend))
        self._set_layout("row")  # the checkpoint's layout
        with torch.no_grad():
            for name, parts in params.items():
                _write_rows(own[name], parts, source, name)
                # packed for the kernels as soon as written: one matrix held twice at a time
                owner = self.get_submodule(name.rpartition(".")[0])
                if owner is self.embed and self.head.weight is self.embed.weight:
                    owner = self.head
                if isinstance(owner, Linear) and name.endswith(".weight"):
                    owner.set_layout(layout)
        self._layout = layout


def _write_rows(target: torch.Tensor, parts: list[str], source: TensorSource, name: str) -> None:
    """Checkpoint tensors ``parts`` into consecutive row slices of ``target`` (parameter
    ``name``), checking that their shapes make up its shape."""
    shapes = []
    for part in parts:
        shape = source.shape(part)
        if shape is None:
            raise KeyError(f"checkpoint has no tensor {part!r}")
        shapes.append(shape)
    whole = (sum(s[0] for s in shapes), *shapes[0][1:])
    if any(s[1:] != shapes[0][1:] for s in shapes) or whole != tuple(target.shape):
        raise ValueError(f"{name}: checkpoint shape {whole} != model {tuple(target.shape)}")
    start = 0
    for part, shape in zip(parts, shapes, strict=True):
        source.read_into(part, target[start : start + shape[0]])
        start += shape[0]
