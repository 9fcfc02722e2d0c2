"""The model families, one module each, and their registry.

A family maps its checkpoints onto the generic decoder (``local_verifier.model``): which
Hugging Face and GGUF architectures it is, how its ``config.json`` or GGUF metadata sets
``ModelConfig``'s switches, the tensor names its checkpoints use and what its tokenizer
leaves implicit. Adding a family is one module here plus its entry in ``FAMILIES`` (or
``register``)."""

from __future__ import annotations

from local_verifier.config import ModelConfig
from local_verifier.families import gemma3, llama, mistral, qwen2, qwen3
from local_verifier.families.base import Family

__all__ = [
    "FAMILIES",
    "Family",
    "for_gguf",
    "for_hf",
    "gguf_architectures",
    "gguf_tensor_name",
    "hf_architectures",
    "register",
    "tensor_names",
]

FAMILIES: list[Family] = [llama.FAMILY, mistral.FAMILY, qwen2.FAMILY, qwen3.FAMILY, gemma3.FAMILY]


def register(family: Family) -> None:
    """Adds ``family`` to the families that checkpoints are read as."""
    FAMILIES.append(family)


def hf_architectures() -> tuple[str, ...]:
    """Every Hugging Face architecture some family reads, in registry order."""
    return tuple(arch for family in FAMILIES for arch in family.hf_architectures)


def for_hf(architectures: list[str]) -> Family | None:
    """The family of the first of ``architectures`` (a ``config.json``'s) that one reads."""
    for arch in architectures:
        for family in FAMILIES:
            if arch in family.hf_architectures:
                return family
    return None


def gguf_architectures() -> tuple[str, ...]:
    """Every GGUF ``general.architecture`` some family reads, in registry order."""
    return tuple(arch for family in FAMILIES for arch in family.gguf_architectures)


def for_gguf(architecture: str) -> Family | None:
    """The family of a GGUF file of ``architecture``, if one reads it."""
    return next((f for f in FAMILIES if architecture in f.gguf_architectures), None)


def gguf_tensor_name(family: Family, name: str) -> str | None:
    """The name the decoder reads GGUF tensor ``name`` of a ``family`` file by (Hugging
    Face's, as ``tensor_names`` lists them); None for a tensor the family has not."""
    if name in llama.GGUF_TOP_TENSORS:
        return llama.GGUF_TOP_TENSORS[name]
    _, layer, rest = name.split(".", 2)
    part = family.gguf_tensors.get(rest) or llama.GGUF_LAYER_TENSORS.get(rest)
    return None if part is None else f"model.layers.{layer}.{part}"


def tensor_names(cfg: ModelConfig, parameter: str) -> list[str] | None:
    """The tensors decoder ``parameter`` is read from, in the names every loader presents
    (Hugging Face's Llama names; Gemma's for the norms around attention and MLP, which only
    its layer has); None for a parameter no checkpoint holds."""
    if not parameter.startswith("layers."):
        return llama.TOP_TENSORS.get(parameter)
    _, layer, rest = parameter.split(".", 2)
    table = gemma3.LAYER_TENSORS if cfg.post_norms else llama.LAYER_TENSORS
    parts = table.get(rest)
    return None if parts is None else [f"model.layers.{layer}.{part}" for part in parts]
