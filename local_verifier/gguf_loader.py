"""Read a GGUF file: model config, dequantized weights (HF names) and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from local_verifier import gemma
from local_verifier.errors import ModelLoadError
from local_verifier.gguf_tokenizer import tokenizer_from_metadata
from local_verifier.model import ModelConfig
from local_verifier.tokenizer import Tokenizer

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA_LAYER_NAMES = {  # Gemma's norms around attention and MLP
    **_LAYER_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader: GGUFReader, max_seq_len: int | None) -> ModelConfig:
    """ModelConfig from ``{arch}.*`` metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )

    def get(key: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    n_heads = int(get("attention.head_count"))
    dim = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", get("rope.dimension_count", dim // n_heads)))
    vocab = _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    rope_scaling = None
    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        rope_scaling = {
            "rope_type": scaling_type,
            "factor": float(get("rope.scaling.factor")),
            "original_max_position_embeddings": int(
                get("rope.scaling.original_context_length", get("context_length"))
            ),
        }
    elif scaling_type not in (None, "none"):
        raise ModelLoadError(
            f"unsupported GGUF rope scaling {scaling_type!r}; supported: linear, yarn"
        )
    if "rope_freqs.weight" in names:
        rope_scaling = {"rope_type": "freq_factors"}
    context = int(get("context_length"))
    n_layers = int(get("block_count"))
    family: dict[str, Any] = {}
    window = _field(reader, f"{arch}.attention.sliding_window")
    if window:
        family.update(sliding_window=int(window))
    if arch == "qwen3":
        family.update(qk_norm=True)
    if arch == "gemma3":  # llama.cpp's converter stores the norms' (1 + w)
        family.update(
            qk_norm=True,
            post_norms=True,
            activation="gelu_tanh",
            embed_scale=dim**0.5,
            layer_types=gemma.layer_types(n_layers) if window else None,
            rope_local_theta=gemma.LOCAL_ROPE_THETA,
        )
    return ModelConfig(
        vocab_size=int(vocab),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        hidden_dim=int(get("feed_forward_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        max_seq_len=min(context, max_seq_len) if max_seq_len else context,
        **family,
    )


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary permutation of q/k rows (interleaved -> rotate-half layout)."""
    rows = w.shape[0]
    return (
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    )


def read_tensors(reader: GGUFReader, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """All tensors dequantized to float32 under Hugging Face names."""
    arch = _field(reader, "general.architecture")
    layer_names = _GEMMA_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            values = dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise ModelLoadError(
                f"tensor {t.name} has type {t.tensor_type.name}, which the gguf package "
                "cannot dequantize"
            ) from exc
        array = np.asarray(values, dtype=np.float32).reshape(shape)
        tensor = torch.from_numpy(array.copy())
        if t.name == "rope_freqs.weight":
            out["rope_freqs"] = tensor
            continue
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        else:
            _, layer, rest = t.name.split(".", 2)
            if rest not in layer_names:
                raise ModelLoadError(f"unexpected GGUF tensor {t.name}")
            name = f"model.layers.{layer}.{layer_names[rest]}"
            if arch == "llama" and rest.startswith("attn_q."):
                tensor = _unpermute(tensor, cfg.n_heads)
            elif arch == "llama" and rest.startswith("attn_k."):
                tensor = _unpermute(tensor, cfg.n_kv_heads)
        out[name] = tensor
    return out


def read_gguf(
    path: Path, max_seq_len: int | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Config, float32 weights (HF names) and tokenizer of a GGUF file."""
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    cfg = read_config(reader, max_seq_len)
    tensors = read_tensors(reader, cfg)
    freqs = tensors.pop("rope_freqs", None)
    if freqs is not None:
        cfg.rope_scaling = {"rope_type": "freq_factors", "factors": freqs.tolist()}
    return cfg, tensors, read_tokenizer(reader)


def read_tokenizer(reader: GGUFReader) -> Tokenizer:
    """The tokenizer of an open GGUF file."""
    arch = _field(reader, "general.architecture")
    return tokenizer_from_metadata(lambda key: _field(reader, key), arch)
