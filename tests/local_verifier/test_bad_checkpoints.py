"""Bad checkpoints get a clear ``ModelLoadError``: a truncated GGUF file, a GGUF of an
architecture we do not run, a byte-level vocabulary without merges, a directory without its
tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from local_verifier.errors import ModelLoadError
from local_verifier.loader import load_model
from tests.local_verifier.test_gguf_tiny import write_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_gguf(tiny_checkpoint, path, GGMLQuantizationType.F32)


@pytest.mark.parametrize("keep", [0.98, 0.5, 0.01])
def test_truncated_gguf(tiny_gguf: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        load_model(str(cut), tune_threads=False)


def test_gguf_of_another_architecture(tmp_path: Path) -> None:
    path = tmp_path / "falcon.gguf"
    writer = GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert GGUFReader(str(path)).fields["general.architecture"].contents() == "falcon"
    with pytest.raises(ModelLoadError, match="'falcon'; supported: llama, qwen2, qwen3, gemma3"):
        load_model(str(path), tune_threads=False)


def test_directory_without_tokenizer(tiny_checkpoint: Path, tmp_path: Path) -> None:
    directory = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_checkpoint, directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer.json"):
        load_model(str(directory), tune_threads=False)


def test_byte_level_vocabulary_without_merges(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = write_gguf(
        tiny_checkpoint, tmp_path / "no-merges.gguf", GGMLQuantizationType.F32, merges=False
    )
    with pytest.raises(ModelLoadError, match="no merges"):
        load_model(str(path), tune_threads=False)
