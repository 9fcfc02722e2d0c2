"""A crafted GGUF file whose metadata sizes what loading builds (context length, block
count, head count) is a ``ModelLoadError`` before the rope tables or modules it would size
are built; files written here with the gguf package's own reader and writer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

from local_verifier.engine import Engine
from local_verifier.errors import ModelLoadError
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import load_model
from local_verifier.model import SeqStep
from tests.local_verifier.test_gguf_tiny import write_gguf


def _gguf(tiny_checkpoint: Path, tmp_path: Path, **config: int) -> Path:
    """The tiny checkpoint as a GGUF file, its ``config.json`` values replaced first."""
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **config}))
    return write_gguf(src, tmp_path / "crafted.gguf", GGMLQuantizationType.F32)


def _set(path: Path, key: str, value: int) -> None:
    """Overwrite one integer metadata value in place (``GGUFReader`` in r+ mode)."""
    reader = GGUFReader(str(path), "r+")
    field = reader.fields[key]
    field.parts[field.data[0]][0] = value
    del reader
    check = GGUFReader(str(path)).fields[key].contents()
    assert check == value


def test_a_huge_context_length_is_refused_before_its_rope_tables(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    path = _gguf(tiny_checkpoint, tmp_path, max_position_embeddings=2**32 - 1)
    with pytest.raises(ModelLoadError, match="rope tables"):
        load_model(str(path), tune_threads=False)
    # a context cut to what the caller asks for loads
    lm = load_model(str(path), max_seq_len=256, tune_threads=False)
    assert lm.context_length == 256 and lm.model.rope_cos.shape[0] == 256


@pytest.mark.parametrize("blocks", [10**9, 1, 0])
def test_a_block_count_other_than_the_files_blocks_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, blocks: int
) -> None:
    path = _gguf(tiny_checkpoint, tmp_path)
    _set(path, "llama.block_count", blocks)
    with pytest.raises(ModelLoadError, match="block_count"):
        load_model(str(path), tune_threads=False)


def test_zero_heads_is_a_load_error(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _gguf(tiny_checkpoint, tmp_path)
    _set(path, "llama.attention.head_count", 0)
    with pytest.raises(ModelLoadError, match="head_count"):
        load_model(str(path), tune_threads=False)


def test_a_kv_cache_bounds_the_rope_tables_to_the_positions_it_holds(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    path = _gguf(tiny_checkpoint, tmp_path, max_position_embeddings=2**32 - 1)
    lm = load_model(str(path), kv_cache_mb=0.25, tune_threads=False)
    per_slot = KVStorage.bytes_per_slot(lm.config, lm.model.kv_dtype)
    slots = int(0.25 * 2**20) // per_slot
    assert lm.config.max_seq_len == 2**32 - 1  # the file's context, for its rope scaling
    assert lm.context_length == slots == lm.model.rope_cos.shape[0]
    whole = load_model(str(path), max_seq_len=slots + 64, tune_threads=False)
    assert torch.equal(lm.model.rope_cos, whole.model.rope_cos[:slots])
    assert torch.equal(lm.model.rope_sin, whole.model.rope_sin[:slots])
    engine = Engine(lm, kv_cache_mb=0.25)
    try:
        assert engine.context_length <= slots
    finally:
        engine.close()
    # a step past the tables is an error naming them, not a read past their end
    kv = KVStorage(lm.config, 4, lm.device, lm.model.kv_dtype)
    past = SeqStep(torch.tensor([1]), torch.tensor([slots]), torch.tensor([0]), torch.arange(0))
    with pytest.raises(IndexError, match=f"the model's {slots} positions"):
        lm.model.step([past], kv)
