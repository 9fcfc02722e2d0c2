"""A Llama-family decoder (Llama 2/3, Qwen2, Mistral, SmolLM) stepping many sequences at once.

``Transformer.step`` runs one forward over the new rows of several sequences (prompt chunks,
decode rows, draft chains and trees) against a shared ``KVStorage``; it is the only forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from local_verifier.config import ModelConfig
from local_verifier.kernels import AttentionPlan, StepOps, step_ops
from local_verifier.kernels.cpp import CppOps
from local_verifier.kernels.fused import FusedStack, LayerWeights
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import Layout, gather_rows
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear, row_major_state
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


SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3", "yarn", "freq_factors")


def rope_inv_freq(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float64) and the attention scaling factor for ``cfg.rope_scaling``."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "freq_factors":  # llama.cpp's rope_freqs tensor (Llama 3 GGUF files)
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64), 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(mid, smoothed, out), 1.0
    if kind == "yarn":
        old_len = float(scaling.get("original_max_position_embeddings", cfg.max_seq_len))
        beta_fast = float(scaling.get("beta_fast", 32.0))
        beta_slow = float(scaling.get("beta_slow", 1.0))
        mscale = float(scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0))

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (
                2 * math.log(cfg.rope_theta)
            )

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
        return inv, mscale
    raise ValueError(
        f"unsupported rope scaling type {kind!r}; supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
    )


def rope_tables(cfg: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_seq_len, head_dim] in float32 (HF "rotate_half" layout, with
    rotate_half's sign folded into the first half of sin: the rotation of x is
    ``x * cos + roll(x, head_dim / 2) * sin``)."""
    inv_freq, mscale = rope_inv_freq(cfg)
    t = torch.arange(cfg.max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    cos = (torch.cat([freqs, freqs], dim=-1).cos() * mscale).float().to(device)
    sin = (torch.cat([-freqs, freqs], dim=-1).sin() * mscale).float().to(device)
    return cos, sin


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

    def forward(self, x: torch.Tensor, kv: KVStorage, step: _StepInputs) -> torch.Tensor:
        cfg, ops = self.cfg, step.ops
        keys, values = kv.k[self.layer], kv.v[self.layer]
        qkv = ops.linear(x, self.wqkv.weight, self.wqkv.bias)
        if cfg.qk_norm:
            qkv = self._norm_qk(qkv, ops)
        cos, sin = step.rope(self.local_rope)
        q = ops.rope_store(qkv, cos, sin, keys, values, step.new_slots, cfg.n_heads, cfg.n_kv_heads)
        out = ops.attention(q, keys, values, step.plan_for(self.window))
        return ops.linear(out.view(x.shape[0], -1), self.wo.weight, None)

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
        gate_up = ops.linear(x, self.w13.weight, None)
        hidden = ops.gelu_tanh_mul(gate_up) if self.gelu else ops.silu_mul(gate_up)
        return ops.linear(hidden, self.w2.weight, None)


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

    def stack_weights(self) -> LayerWeights:
        """The parameters as the fused C++ stack reads them."""
        return LayerWeights(
            attn_norm=self.attn_norm.weight,
            attn_eps=self.attn_norm.eps,
            wqkv=self.attn.wqkv.weight,
            bqkv=self.attn.wqkv.bias,
            wo=self.attn.wo.weight,
            ffn_norm=self.ffn_norm.weight,
            ffn_eps=self.ffn_norm.eps,
            w13=self.ffn.w13.weight,
            w2=self.ffn.w2.weight,
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


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, without the copy for one part (a decode step's one sequence)."""
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


class Transformer(nn.Module):
    """Llama-family decoder: ``step(seqs, kv)`` over many sequences' rows at once."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
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
            self.rope_cos, self.rope_sin = rope_tables(cfg, torch.device("cpu"))
            if cfg.rope_local_theta is not None:  # sliding layers: their own base, no scaling
                local = replace(cfg, rope_theta=cfg.rope_local_theta, rope_scaling=None)
                self.local_rope = rope_tables(local, torch.device("cpu"))
        self._stack: tuple[FusedStack | None] | None = None  # built at first use
        self._graphs: StepGraphs | None = None  # the Triton step's, built at first use
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
        return self.embed.weight.device

    @property
    def weight_dtype(self) -> torch.dtype:
        """The parameters' dtype: the target's precision (float32, or bfloat16 for the bf16
        target)."""
        return self.embed.weight.dtype

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
        if (
            not isinstance(ops, CppOps)
            or not self.kernel_options.fused
            or not self.config.llama_layers
        ):
            return None  # the other families' layers run op by op
        if self._stack is None:
            layers = [cast(Block, b).stack_weights() for b in self.layers]
            cfg = self.config
            self._stack = (
                FusedStack.build(
                    ops.library, layers, self.norm.weight, self.norm.eps, self.head.weight,
                    cfg.n_heads, cfg.n_kv_heads,
                ),
            )  # fmt: skip
        return self._stack[0]

    def _triton_graphs(self, ops: StepOps, kv: KVStorage) -> StepGraphs | None:
        """The Triton step of a Llama-family model over ``kv`` (None for other kernels or
        families, which run op by op); rebuilt when the K/V storage changes."""
        cfg = self.config
        if ops.name != "triton" or not cfg.llama_layers or cfg.embed_scale is not None:
            return None
        capture = self.kernel_options.graphs
        if self._graphs is None or self._graphs.k is not kv.k or self._graphs.capture != capture:
            from local_verifier.kernels.triton_stack import (
                GRAPH_ROWS,
                StackWeights,
                StepGraphs,
                TritonStack,
            )

            stack = TritonStack(StackWeights.of(self), cast(Any, ops))
            self._graphs = StepGraphs(stack, kv.k, kv.v, GRAPH_ROWS, cfg.max_seq_len, capture)
        return self._graphs

    @torch.inference_mode()
    def step(self, seqs: Sequence[SeqStep], kv: KVStorage) -> list[torch.Tensor]:
        """One forward over every sequence's rows; returns per sequence float32 logits
        [T, V] ("all"), [1, V] ("last") or [0, V] ("none").

        Writes every row's K/V to its ``new_slots``, all distinct (rejected draft rows are
        simply overwritten later). See ``SeqStep`` for what a row attends to.
        """
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
        stack = self._fused(ops) if kv.k.is_contiguous() and kv.v.is_contiguous() else None
        if stack is not None:  # the same kernels in the same order, in one C++ call
            rows_out = torch.tensor(logit_rows, dtype=torch.long)
            plan = inputs.plan_for(self.config.window(0))  # one window on every layer
            logits = stack.run(x, inputs.cos, inputs.sin, new_slots, plan, kv.k, kv.v, rows_out)
            return list(logits.split(counts))
        for layer in self.layers:
            x = layer(x, kv, inputs)
        x = x[torch.tensor(logit_rows, dtype=torch.long, device=device)]
        x = ops.rms_norm(x, self.norm.weight, self.norm.eps)
        return list(ops.linear(x, self.head.weight, None).float().split(counts))

    def load_hf_weights(self, source: TensorSource) -> None:
        """Write the weights of a checkpoint named as Hugging Face's Llama family names them
        (``model.layers...``) into the parameters in place: a fused matrix's parts into its
        row slices, each tensor converted once into the parameter's dtype and device. A tied
        head is the embedding (the checkpoint's ``lm_head.weight``, if any, unread)."""
        cfg = self.config

        params: dict[str, list[str]] = {
            "embed.weight": ["model.embed_tokens.weight"],
            "norm.weight": ["model.norm.weight"],
        }
        if self.head.weight is not self.embed.weight:
            params["head.weight"] = ["lm_head.weight"]
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            ours = f"layers.{i}."
            params[ours + "attn_norm.weight"] = [p + "input_layernorm.weight"]
            if cfg.post_norms:  # Gemma's names: the post-attention norm is not the pre-MLP one
                params[ours + "ffn_norm.weight"] = [p + "pre_feedforward_layernorm.weight"]
                params[ours + "post_attn_norm.weight"] = [p + "post_attention_layernorm.weight"]
                params[ours + "post_ffn_norm.weight"] = [p + "post_feedforward_layernorm.weight"]
            else:
                params[ours + "ffn_norm.weight"] = [p + "post_attention_layernorm.weight"]
            if cfg.qk_norm:
                params[ours + "attn.q_norm.weight"] = [p + "self_attn.q_norm.weight"]
                params[ours + "attn.k_norm.weight"] = [p + "self_attn.k_norm.weight"]
            params[ours + "attn.wqkv.weight"] = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            if cfg.qkv_bias:
                params[ours + "attn.wqkv.bias"] = [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
            params[ours + "attn.wo.weight"] = [p + "self_attn.o_proj.weight"]
            params[ours + "ffn.w13.weight"] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
            params[ours + "ffn.w2.weight"] = [p + "mlp.down_proj.weight"]
        layout = self._layout_for(step_ops(self.device, self.dtype, self.kernel_options.backend))
        self._set_layout("row")  # the checkpoint's layout
        own = dict(self.named_parameters())
        missing = set(own) - set(params)
        if missing:
            raise KeyError(f"no weights for {sorted(missing)[:5]}")
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
