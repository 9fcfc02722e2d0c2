"""Read a Hugging Face checkpoint directory: config, safetensors weights, tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as BackendTokenizer

from local_verifier import families
from local_verifier.config import ModelConfig
from local_verifier.errors import ModelLoadError
from local_verifier.families import Family
from local_verifier.rope import SUPPORTED_ROPE_SCALING
from local_verifier.safetensors_source import SafetensorsSource
from local_verifier.tokenizer import Tokenizer
from local_verifier.weights import TensorSource


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _family(raw: dict[str, Any]) -> Family:
    """The family a ``config.json`` names; ``ModelLoadError`` where none reads it."""
    archs = raw.get("architectures") or []
    family = families.for_hf(archs)
    if family is None:
        supported = ", ".join(families.hf_architectures())
        raise ModelLoadError(f"unsupported architecture {archs}; supported: {supported}")
    return family


def read_config(directory: Path) -> ModelConfig:
    """ModelConfig from ``config.json``."""
    raw = _read_json(directory / "config.json")
    if not raw:
        raise ModelLoadError(f"{directory} has no config.json")
    family = _family(raw)
    params = raw.get("rope_parameters") or {}
    global_params = params.get("full_attention", params)  # per layer type (Gemma 3) or one
    scaling = raw.get("rope_scaling") or global_params or None
    theta = raw.get("rope_theta") or (scaling or {}).get("rope_theta") or 10000.0
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in SUPPORTED_ROPE_SCALING:
            raise ModelLoadError(
                f"unsupported rope scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
            )
        if kind == "default":
            scaling = None
    n_heads = raw["num_attention_heads"]
    context = int(raw.get("max_position_embeddings", 2048))
    fields: dict[str, Any] = {}
    if (window := raw.get("sliding_window")) is not None:
        types = raw.get("layer_types")
        fields.update(
            sliding_window=int(window), layer_types=None if types is None else tuple(types)
        )
    fields.update(family.hf_config(raw))
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        dim=raw["hidden_size"],
        n_layers=raw["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=raw.get("num_key_value_heads") or n_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // n_heads,
        hidden_dim=raw["intermediate_size"],
        rope_theta=float(theta),
        rope_scaling=scaling,
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", family.tie_embeddings)),
        qkv_bias=bool(raw.get("attention_bias", family.qkv_bias)),
        max_seq_len=context,
        **fields,
    )


def read_tensors(directory: Path, offset_norms: bool = False) -> SafetensorsSource:
    """The tensors of ``model.safetensors`` or of the shards in its index (read on demand)."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(_read_json(index)["weight_map"].values()))
    elif (directory / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(
            f"{directory} has no model.safetensors or model.safetensors.index.json "
            "(only safetensors checkpoints are supported)"
        )
    return SafetensorsSource([directory / name for name in files], offset_norms)


def read_tokenizer(directory: Path) -> Tokenizer:
    """Tokenizer from ``tokenizer.json`` + ``tokenizer_config.json`` + ``generation_config.json``."""
    path = directory / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{directory} has no tokenizer.json")
    backend = BackendTokenizer.from_file(str(path))
    tok_cfg = _read_json(directory / "tokenizer_config.json")
    gen_cfg = _read_json(directory / "generation_config.json")
    model_cfg = _read_json(directory / "config.json")

    def token_text(value: Any) -> str | None:
        return value.get("content") if isinstance(value, dict) else value

    special = {
        key: text
        for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (text := token_text(tok_cfg.get(key))) is not None
    }
    eos_ids: set[int] = set()
    for source in (gen_cfg.get("eos_token_id"), model_cfg.get("eos_token_id")):
        if source is not None:
            eos_ids.update(source if isinstance(source, list) else [source])
    if "eos_token" in special and (eos := backend.token_to_id(special["eos_token"])) is not None:
        eos_ids.add(eos)
    bos = backend.token_to_id(special["bos_token"]) if "bos_token" in special else None
    template = tok_cfg.get("chat_template")
    if template is None and (directory / "chat_template.jinja").exists():
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    return Tokenizer(
        backend,
        eos_ids=eos_ids,
        bos_id=bos,
        chat_template=template if isinstance(template, str) else None,
        special_tokens=special,
        add_bos=bool(tok_cfg.get("add_bos_token", False)),
    )


class RenamedSource:
    """A ``TensorSource`` presenting a checkpoint's tensors under the decoder's names."""

    def __init__(self, source: TensorSource, name: Callable[[str], str]) -> None:
        self._source = source
        self._name = name  # the decoder's name -> the checkpoint's

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self._source.shape(self._name(name))

    def read_into(self, name: str, out: torch.Tensor) -> None:
        self._source.read_into(self._name(name), out)


def read_hf_dir(directory: Path) -> tuple[ModelConfig, TensorSource, Tokenizer]:
    """Config, weights (under the decoder's names; norms as the (1 + w) they apply where the
    family stores w) and tokenizer of a checkpoint directory."""
    cfg = read_config(directory)
    tokenizer = read_tokenizer(directory)
    family = _family(_read_json(directory / "config.json"))
    source: TensorSource = read_tensors(directory, offset_norms=family.offset_norms)
    if family.hf_name is not None:
        source = RenamedSource(source, family.hf_name)
    return cfg, source, tokenizer
