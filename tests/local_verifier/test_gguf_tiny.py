"""A tiny GGUF written here from the tiny HF checkpoint (llama.cpp layout: permuted q/k,
GGUF names, tokenizer metadata) loads to the same model and tokenizer as the HF directory."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file

from local_verifier.errors import ModelLoadError
from local_verifier.loader import LoadedModel, load_model
from local_verifier.testing.kv_cache import forward, new_cache


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(
    src: Path,
    dst: Path,
    qtype: GGMLQuantizationType,
    merges: bool = True,
    arch: str = "llama",
) -> Path:
    """``src``'s Llama checkpoint as llama.cpp's converter writes it, its metadata under
    ``arch``."""
    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    writer = GGUFWriter(str(dst), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    if merges:
        writer.add_token_merges(
            [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
        )
    writer.add_bos_token_id(vocab[tok_cfg["bos_token"]])
    writer.add_eos_token_id(vocab[tok_cfg["eos_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok_cfg["chat_template"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        array = tensor.float().numpy()
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if ".self_attn.q_proj." in name:
            array = _permute(array, cfg["num_attention_heads"])
        elif ".self_attn.k_proj." in name:
            array = _permute(array, cfg["num_key_value_heads"])
        if array.ndim == 1 or qtype == GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, array.astype(np.float32))
        elif qtype == GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, array.astype(np.float16))
        elif qtype == GGMLQuantizationType.I8:  # a type the gguf package does not dequantize
            writer.add_tensor(gguf_name, array.astype(np.int8))
        else:
            writer.add_tensor(gguf_name, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize(
    ("qtype", "atol"),
    [
        (GGMLQuantizationType.F32, 1e-4),
        (GGMLQuantizationType.F16, 0.05),
        (GGMLQuantizationType.Q8_0, 0.1),
        (GGMLQuantizationType.Q5_0, 0.3),
        (GGMLQuantizationType.Q5_1, 0.3),
    ],
)
def test_gguf_matches_hf_directory(
    tiny_checkpoint: Path,
    tiny_lm: LoadedModel,
    tmp_path: Path,
    qtype: GGMLQuantizationType,
    atol: float,
) -> None:
    path = write_gguf(tiny_checkpoint, tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    lm = load_model(str(path), device="cpu", dtype="float32")
    assert lm.config.norm_eps == pytest.approx(tiny_lm.config.norm_eps)  # stored as float32
    assert replace(lm.config, norm_eps=tiny_lm.config.norm_eps) == tiny_lm.config
    text = "def add(a, b):\n    return a + b  # 🙂 안녕"
    ids = tiny_lm.tokenizer.encode(text)
    assert lm.tokenizer.encode(text) == ids
    assert lm.tokenizer.eos_ids == {2}
    messages = [{"role": "user", "content": "hi"}]
    assert lm.tokenizer.apply_chat_template(messages) == tiny_lm.tokenizer.apply_chat_template(
        messages
    )
    ours = forward(lm.model, torch.tensor(ids), new_cache(lm, len(ids)))
    ref = forward(tiny_lm.model, torch.tensor(ids), new_cache(tiny_lm, len(ids)))
    torch.testing.assert_close(ours, ref, atol=atol, rtol=0.0)


def test_tensor_type_without_dequantization_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = write_gguf(tiny_checkpoint, tmp_path / "i8.gguf", GGMLQuantizationType.I8)
    with pytest.raises(ModelLoadError, match="type I8, which the gguf package cannot dequantize"):
        load_model(str(path))
