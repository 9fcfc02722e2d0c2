"""Rotary position embedding: the inverse frequencies of each rope scaling type and the
cos/sin tables the decoder's steps index by position."""

from __future__ import annotations

import math

import torch

from local_verifier.config import ModelConfig

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


ROPE_CHUNK = 1024  # positions per float64 pass of rope_tables


def rope_tables(
    cfg: ModelConfig, device: torch.device, positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [positions, head_dim] in float32 (HF "rotate_half" layout, with
    rotate_half's sign folded into the first half of sin: the rotation of x is
    ``x * cos + roll(x, head_dim / 2) * sin``)."""
    inv_freq, mscale = rope_inv_freq(cfg)
    half = inv_freq.numel()
    cos = torch.empty(positions, 2 * half)
    sin = torch.empty(positions, 2 * half)
    for start in range(0, positions, ROPE_CHUNK):  # float64 a chunk at a time: small temporaries
        t = torch.arange(start, min(start + ROPE_CHUNK, positions), dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        rows = slice(start, start + len(t))
        cos[rows, :half] = cos[rows, half:] = freqs.cos() * mscale
        sin[rows, :half] = (-freqs).sin() * mscale
        sin[rows, half:] = freqs.sin() * mscale
    return cos.to(device), sin.to(device)
