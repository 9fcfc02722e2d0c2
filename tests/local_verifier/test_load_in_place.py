"""Loading at the model's own size: parameters written in place in the target dtype, a tied
head that is the embedding, and clear errors for what cannot be loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from local_verifier.errors import ModelLoadError
from local_verifier.kernels.packing import PACK, gather_rows, pack
from local_verifier.loader import load_model, smollm2_path
from tests.local_verifier.conftest import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tied_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint with a tied head, saved in bf16 (no ``lm_head.weight``)."""
    directory = write_tiny_checkpoint(
        tmp_path_factory.mktemp("tied-bf16"), tie_word_embeddings=True
    )
    weights = directory / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(weights))
    return directory


def _copy(src: Path, dst: Path, without: str | None = None) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(without) if without else None)
    return dst


def test_bf16_checkpoint_lands_in_the_bf16_parameters_unchanged(tied_bf16: Path) -> None:
    """Every parameter is bf16, the fused matrices hold the checkpoint's tensors in row
    order, bit for bit, and the head is the embedding tensor itself."""
    lm = load_model(str(tied_bf16), device="cpu", dtype="bf16", tune_threads=False)
    model = lm.model
    assert model.head.weight is model.embed.weight
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ckpt = load_file(str(tied_bf16 / "model.safetensors"))
    state = model.state_dict()  # row-major whatever layout the kernels hold
    p = "model.layers.1."
    wqkv = torch.cat([ckpt[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
    w13 = torch.cat([ckpt[p + "mlp.gate_proj.weight"], ckpt[p + "mlp.up_proj.weight"]])
    assert torch.equal(state["layers.1.attn.wqkv.weight"], wqkv)
    assert torch.equal(state["layers.1.ffn.w13.weight"], w13)
    assert torch.equal(state["layers.1.ffn.w2.weight"], ckpt[p + "mlp.down_proj.weight"])
    assert torch.equal(state["embed.weight"], ckpt["model.embed_tokens.weight"])
    assert torch.equal(state["head.weight"], ckpt["model.embed_tokens.weight"])


def test_float32_checkpoint_to_bf16_rounds_each_value_once(tiny_checkpoint: Path) -> None:
    """An untied float32 checkpoint loaded as bf16: each weight is its float32 value rounded
    to bf16 (the one conversion), the head its own tensor."""
    lm = load_model(str(tiny_checkpoint), device="cpu", dtype="bf16", tune_threads=False)
    assert lm.model.head.weight is not lm.model.embed.weight
    ckpt = load_file(str(tiny_checkpoint / "model.safetensors"))
    state = lm.model.state_dict()
    assert torch.equal(state["head.weight"], ckpt["lm_head.weight"].to(torch.bfloat16))
    assert torch.equal(
        state["layers.0.attn_norm.weight"],
        ckpt["model.layers.0.input_layernorm.weight"].to(torch.bfloat16),
    )


@pytest.mark.parametrize("layout", ["packed", "amx"])
def test_packed_tied_head_gives_the_embedding_rows(layout: str) -> None:
    """The embedding read from the head's packed weight: the row-major rows, bit for bit."""
    weight = torch.randn(4 * PACK, 64).to(torch.bfloat16)
    index = torch.tensor([0, 17, 63, 5, 17, 32])
    assert torch.equal(gather_rows(pack(weight, layout), index), weight[index])  # type: ignore[arg-type]


def test_truncated_safetensors_is_a_load_error(tied_bf16: Path, tmp_path: Path) -> None:
    directory = _copy(tied_bf16, tmp_path / "truncated")
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cannot read safetensors file .*model.safetensors"):
        load_model(str(directory), device="cpu", dtype="bf16", tune_threads=False)


def test_truncated_gguf_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    with smollm2_path().open("rb") as src:
        path.write_bytes(src.read(8 << 20))
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        load_model(str(path), device="cpu", dtype="bf16", tune_threads=False)


def test_too_big_for_memory_names_both_figures(tied_bf16: Path) -> None:
    """Refused before anything is allocated: what it needs against what is free."""
    with pytest.raises(ModelLoadError, match=r"needs [\d.]+ GiB .* has [\d.]+ GiB available"):
        load_model(str(tied_bf16), device="cpu", dtype="bf16", kv_cache_mb=2**40)


def test_missing_tokenizer_is_a_load_error(tied_bf16: Path, tmp_path: Path) -> None:
    directory = _copy(tied_bf16, tmp_path / "no-tokenizer", without="tokenizer.json")
    with pytest.raises(ModelLoadError, match="has no tokenizer.json"):
        load_model(str(directory), device="cpu", dtype="bf16", tune_threads=False)
