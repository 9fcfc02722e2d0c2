"""A family added through ``local_verifier.families``: a Llama checkpoint whose tensors live
under another prefix and another architecture name loads only once its family is registered,
and then decodes bitwise as the same weights under Llama's names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from local_verifier import families
from local_verifier.errors import ModelLoadError
from local_verifier.families import Family
from local_verifier.loader import load_model
from tests.local_verifier.stepping import plain_decode
from tests.local_verifier.test_families import PROMPTS, write_family

ARCH = "RenamedLlamaForCausalLM"
RENAMED = Family(
    name="renamed-llama",
    hf_architectures=(ARCH,),
    hf_name=lambda name: name.replace("model.", "decoder.", 1),
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
    ours = load_model(str(renamed), device="cpu", dtype="float32", tune_threads=False)
    base = load_model(str(llama), device="cpu", dtype="float32", tune_threads=False)
    ids = base.tokenizer.encode(PROMPTS[0])
    tokens, logits = plain_decode(ours, ids, 8)
    base_tokens, base_logits = plain_decode(base, ids, 8)
    assert tokens == base_tokens
    assert torch.equal(logits, base_logits)
