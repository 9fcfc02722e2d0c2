"""Read a GGUF file: model config, dequantized weights (HF names) and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from local_verifier.errors import ModelLoadError
from local_verifier.model import ModelConfig
from local_verifier.tokenizer import Tokenizer

SUPPORTED_ARCHS = ("llama", "qwen2")
Q = GGMLQuantizationType
SUPPORTED_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)

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
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# llama.cpp pre-tokenizer names -> split regex (byte-level BPE vocabularies)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "default": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4


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
    return ModelConfig(
        vocab_size=int(vocab),
        dim=dim,
        n_layers=int(get("block_count")),
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
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"tensor {t.name} has unsupported type {t.tensor_type.name}; supported: "
                + ", ".join(q.name for q in SUPPORTED_TYPES)
            )
        shape = tuple(int(d) for d in reversed(t.shape))
        array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        tensor = torch.from_numpy(array.copy())
        if t.name == "rope_freqs.weight":
            out["rope_freqs"] = tensor
            continue
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        else:
            _, layer, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                raise ModelLoadError(f"unexpected GGUF tensor {t.name}")
            name = f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
            if arch == "llama" and rest.startswith("attn_q."):
                tensor = _unpermute(tensor, cfg.n_heads)
            elif arch == "llama" and rest.startswith("attn_k."):
                tensor = _unpermute(tensor, cfg.n_kv_heads)
        out[name] = tensor
    return out


def read_tokenizer(reader: GGUFReader) -> Tokenizer:
    """Rebuild the byte-level BPE tokenizer from ``tokenizer.ggml.*`` metadata."""
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            f"unsupported GGUF tokenizer {kind!r}; supported: gpt2 (byte-level BPE)"
        )
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        split = [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"),
        ]
    elif pre in _PRE_SPLITS:
        split = [pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated")]
    else:
        raise ModelLoadError(
            f"unsupported GGUF pre-tokenizer {pre!r}; supported: smollm, {', '.join(_PRE_SPLITS)}"
        )
    backend.pre_tokenizer = pre_tokenizers.Sequence([*split, byte_level])
    backend.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == _CONTROL
    ]
    backend.add_special_tokens(special)
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _USER_DEFINED
        ]
    )

    def token_of(key: str) -> int | None:
        value = _field(reader, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    eos_ids = {
        i for i in (eos, token_of("eot_token_id"), token_of("eom_token_id")) if i is not None
    }
    named = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_of("unknown_token_id"),
        "pad_token": token_of("padding_token_id"),
    }
    return Tokenizer(
        backend,
        eos_ids=eos_ids,
        bos_id=bos,
        chat_template=_field(reader, "tokenizer.chat_template"),
        special_tokens={k: tokens[v] for k, v in named.items() if v is not None},
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


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
