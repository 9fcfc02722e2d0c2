"""``GGUFFile`` reads what the gguf package's ``GGUFReader`` reads: every metadata value,
every tensor's type, shape, place and data view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from local_verifier.gguf_file import GGUFFile
from local_verifier.loader import smollm2_path
from tests.local_verifier.test_gguf_tiny import write_gguf


def assert_same(path: Path) -> None:
    ours, reference = GGUFFile(path), GGUFReader(str(path))
    fields = {k: f for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert set(ours.fields) == set(fields)
    for key, field in fields.items():
        assert ours.fields[key] == pytest.approx(field.contents()), key
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert (mine.data_offset, mine.n_bytes) == (theirs.data_offset, theirs.n_bytes)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data)


def test_smollm2_file() -> None:
    assert_same(smollm2_path())


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F16, GGMLQuantizationType.Q5_1])
def test_written_files(tiny_checkpoint: Path, tmp_path: Path, qtype: GGMLQuantizationType) -> None:
    assert_same(write_gguf(tiny_checkpoint, tmp_path / "tiny.gguf", qtype))


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="magic"):
        GGUFFile(path)
