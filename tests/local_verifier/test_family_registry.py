"""A family added through ``local_verifier.families``: a Llama checkpoint whose tensors live
under another prefix and another architecture name (a Hugging Face directory, or a GGUF file
of another ``general.architecture``) loads only once its family is registered, and then
decodes bitwise as the same weights under Llama's names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from local_verifier import families
from local_verifier.errors import ModelLoadError
from local_verifier.families import Family
from local_verifier.loader import load_model
from tests.local_verifier.stepping import plain_decode
from tests.local_verifier.test_families import PROMPTS, write_family
from tests.local_verifier.test_gguf_tiny import write_gguf

ARCH = "RenamedLlamaForCausalLM"
RENAMED = Family(
    name="renamed-llama",
    hf_architectures=(ARCH,),
    hf_name=lambda name: name.replace("model.", "decoder.", 1),
)

GGUF_ARCH = "renamedllama"
GGUF_RENAMED = Family(
    name="renamed-llama-gguf",
    hf_architectures=(),
    gguf_architectures=(GGUF_ARCH,),
    gguf_interleaved_qk=True,  # written by llama.cpp's converter as Llama's
)


def write_renamed(llama: Path, directory: Path) -> Path:
    """``llama``'s checkpoint with ``model.*`` tensors under ``decoder.*`` and ``ARCH``."""
    shutil.copytree(llama, directory)
    tensors = load_file(str(llama / "model.safetensors"))
    renamed = {name.replace("model.", "decoder.", 1): t for name, t in tensors.items()}
    assert set(renamed) != set(tensors)
    save_file(renamed, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((llama / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": [ARCH]}))
    return directory


def assert_decodes_as(path: Path, base_path: Path) -> None:
    """The checkpoint at ``path`` loads as the one at ``base_path``: the same config and
    tokens, and bitwise the same greedy decoding."""
    ours = load_model(str(path), device="cpu", dtype="float32", tune_threads=False)
    base = load_model(str(base_path), device="cpu", dtype="float32", tune_threads=False)
    assert ours.config == base.config
    ids = base.tokenizer.encode(PROMPTS[0])
    assert ours.tokenizer.encode(PROMPTS[0]) == ids
    tokens, logits = plain_decode(ours, ids, 8)
    base_tokens, base_logits = plain_decode(base, ids, 8)
    assert tokens == base_tokens
    assert torch.equal(logits, base_logits)


def test_a_registered_family_loads_and_decodes_as_its_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama = write_family(tmp_path / "llama", "llama3-untied")
    renamed = write_renamed(llama, tmp_path / "renamed")
    with pytest.raises(ModelLoadError, match=f"unsupported architecture \\['{ARCH}'\\]"):
        load_model(str(renamed), tune_threads=False)

    monkeypatch.setattr(families, "FAMILIES", list(families.FAMILIES))
    families.register(RENAMED)
    assert ARCH in families.hf_architectures()
    assert_decodes_as(renamed, llama)


def test_a_registered_gguf_family_loads_and_decodes_as_its_base(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f32 = GGMLQuantizationType.F32
    llama = write_gguf(tiny_checkpoint, tmp_path / "llama.gguf", f32)
    renamed = write_gguf(tiny_checkpoint, tmp_path / "renamed.gguf", f32, arch=GGUF_ARCH)
    with pytest.raises(ModelLoadError, match=f"unsupported GGUF architecture '{GGUF_ARCH}'"):
        load_model(str(renamed), tune_threads=False)

    monkeypatch.setattr(families, "FAMILIES", list(families.FAMILIES))
    families.register(GGUF_RENAMED)
    assert GGUF_ARCH in families.gguf_architectures()
    assert_decodes_as(renamed, llama)
