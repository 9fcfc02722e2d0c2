"""A Llama-family decoder (Llama 2/3, Qwen2, Mistral, SmolLM) for batch-1 decoding.

One forward runs T new tokens against a static KV cache: plain decoding (T = 1), prefill,
and verification of a draft chain or tree (T = k, with an explicit ``tree_mask``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from local_verifier.kv_cache import KVCache
from local_verifier.linear import Linear


@dataclass
class ModelConfig:
    """Shape and numerics of a Llama-family decoder."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    max_seq_len: int = 2048


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
    rotate_half's sign folded into the first half of sin)."""
    inv_freq, mscale = rope_inv_freq(cfg)
    t = torch.arange(cfg.max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    cos = (torch.cat([freqs, freqs], dim=-1).cos() * mscale).float().to(device)
    sin = (torch.cat([-freqs, freqs], dim=-1).sin() * mscale).float().to(device)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by cos/sin [T, 1, D] (computed in float32).

    ``sin`` carries the sign of HF's ``rotate_half`` in its first half, so the rotation is
    ``x * cos + roll(x, D/2) * sin``.
    """
    xf = x.float()
    return torch.addcmul(xf * cos, xf.roll(x.shape[-1] // 2, -1), sin).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like the reference."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel, same formula
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with fused q/k/v projection."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.dim, q + 2 * kv, bias=cfg.qkv_bias)
        self.wo = Linear(q, cfg.dim)

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        qk, v = self.wqkv(x).split([q_size + kv_size, kv_size], dim=-1)
        # q and k heads rotated in one pass: [T, n_heads + n_kv_heads, head_dim]
        qk = apply_rope(qk.view(t, cfg.n_heads + cfg.n_kv_heads, cfg.head_dim), cos, sin)
        q = qk[:, : cfg.n_heads].transpose(0, 1)
        k = qk[:, cfg.n_heads :].transpose(0, 1)
        v = v.view(t, cfg.n_kv_heads, cfg.head_dim).transpose(0, 1)
        keys, values = cache.write(self.layer, k, v, t)
        causal = mask is None and t > 1  # a plain prefill from slot 0
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            enable_gqa=True,
        )
        return self.wo(out.squeeze(0).transpose(0, 1).reshape(t, q_size))


class FeedForward(nn.Module):
    """SwiGLU MLP with fused gate/up projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.hidden = cfg.hidden_dim
        self.w13 = Linear(cfg.dim, 2 * cfg.hidden_dim)
        self.w2 = Linear(cfg.hidden_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split([self.hidden, self.hidden], dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cache, cos, sin, mask)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """Batch-1 decoder: ``forward(tokens, cache, positions, tree_mask) -> logits [T, vocab]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = Linear(cfg.dim, cfg.vocab_size)
        # plain attributes, not buffers: dtype casts of the module must not round them
        self.rope_cos, self.rope_sin = rope_tables(cfg, torch.device("cpu"))

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
            if cfg.tie_embeddings:
                model.head.weight.copy_(model.embed.weight)
        return model.to(device=device, dtype=dtype).eval()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def to(self, *args: Any, **kwargs: Any) -> Transformer:
        """Like ``nn.Module.to``; the float32 rope tables follow the device only."""
        super().to(*args, **kwargs)
        self.rope_cos = self.rope_cos.to(self.device)
        self.rope_sin = self.rope_sin.to(self.device)
        return self

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run T new tokens; returns float32 logits [T, vocab] ([1, vocab] with ``last_only``).

        The tokens' K/V go to cache slots [cache.length, cache.length + T) and cache.length
        advances by T. ``tree_mask[i, j]``: new token i may attend to new token j (None =
        causal); every new token attends to the whole committed prefix.
        """
        t = tokens.shape[0]
        start = cache.length
        if start + t > cache.max_len:
            raise ValueError(f"{start + t} tokens exceed the cache's {cache.max_len} slots")
        if positions is None:
            cos = self.rope_cos[start : start + t].unsqueeze(1)
            sin = self.rope_sin[start : start + t].unsqueeze(1)
        else:
            cos = self.rope_cos[positions].unsqueeze(1)
            sin = self.rope_sin[positions].unsqueeze(1)
        mask = self._mask(t, start, tree_mask)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cache, cos, sin, mask)
        cache.length = start + t
        if last_only:
            x = x[-1:]
        return self.head(self.norm(x)).float()

    def _mask(self, t: int, start: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Boolean attention mask [T, start + T] (True = may attend); None when T == 1 or for a
        causal run from slot 0 (then attention is told ``is_causal``)."""
        if tree_mask is None and (t == 1 or start == 0):
            return None
        device = self.rope_cos.device
        new = (
            tree_mask.to(device=device, dtype=torch.bool)
            if tree_mask is not None
            else torch.ones(t, t, dtype=torch.bool, device=device).tril()
        )
        prefix = torch.ones(t, start, dtype=torch.bool, device=device)
        return torch.cat([prefix, new], dim=1)

    def load_hf_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in a Hugging Face Llama/Qwen2 checkpoint (``model.layers...``)."""
        cfg = self.config

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise KeyError(f"checkpoint has no tensor {name!r}")
            return tensors[name]

        params: dict[str, torch.Tensor] = {
            "embed.weight": take("model.embed_tokens.weight"),
            "norm.weight": take("model.norm.weight"),
        }
        head = tensors.get("lm_head.weight")
        params["head.weight"] = (
            head if head is not None and not cfg.tie_embeddings else params["embed.weight"]
        )
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            ours = f"layers.{i}."
            params[ours + "attn_norm.weight"] = take(p + "input_layernorm.weight")
            params[ours + "ffn_norm.weight"] = take(p + "post_attention_layernorm.weight")
            params[ours + "attn.wqkv.weight"] = torch.cat(
                [take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            )
            if cfg.qkv_bias:
                params[ours + "attn.wqkv.bias"] = torch.cat(
                    [take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
                )
            params[ours + "attn.wo.weight"] = take(p + "self_attn.o_proj.weight")
            params[ours + "ffn.w13.weight"] = torch.cat(
                [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]
            )
            params[ours + "ffn.w2.weight"] = take(p + "mlp.down_proj.weight")
        own = dict(self.named_parameters())
        missing = set(own) - set(params)
        if missing:
            raise KeyError(f"no weights for {sorted(missing)[:5]}")
        with torch.no_grad():
            for name, value in params.items():
                target = own[name]
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(value.shape)} != model {tuple(target.shape)}"
                    )
                target.copy_(value.to(target.dtype))
