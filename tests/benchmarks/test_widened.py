"""SmolLM2 widened with zeros (``benchmarks.widened``) computes SmolLM2's function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import bench_models
from benchmarks.bench_speculative import run_plain
from benchmarks.widened import widened_config
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import load_model
from local_verifier.model import SeqStep


def _logits(path: str, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    lm = load_model(path, dtype="float32", tune_threads=False)
    kv = KVStorage(lm.config, len(ids), dtype=lm.model.kv_dtype)
    slots = torch.arange(len(ids))
    logits = lm.model.step([SeqStep(torch.tensor(ids), slots, slots, slots[:0])], kv)[0]
    return logits, run_plain(lm, ids, 24)["ids"]


@pytest.mark.slow
def test_a_widened_smollm2_gives_smollm2s_logits_and_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench_models.SHAPES, "wide", widened_config(768, 12, 2048))
    monkeypatch.setattr(bench_models, "WIDENED", {"wide"})
    bench_models.write_checkpoint(tmp_path, "wide")
    source = load_model("smollm2-135m", dtype="float32", tune_threads=False)
    text = "def area(r):\n    return 3.14159 * r * r\n\nprint(area(2))\n"
    ids = source.tokenizer.encode(text)
    small, small_text = _logits("smollm2-135m", ids)
    wide, wide_text = _logits(str(tmp_path), ids)
    assert wide.shape == small.shape
    assert (wide - small).abs().max() < 1e-3 * small.abs().max()  # the sums' order differs
    assert torch.equal(wide.argmax(-1), small.argmax(-1))
    assert wide_text == small_text
