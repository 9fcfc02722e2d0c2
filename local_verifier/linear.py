"""Linear layer whose matrix-product path is chosen per row count, by measurement, at load time.

On CPU, MKL's plain ``F.linear`` is far from the memory-bandwidth limit for the small row
counts of decoding and draft verification; a pre-transposed weight (``x @ wt``) or oneDNN's
packed linear is often faster. Which one wins depends on the shape, the row count and the
machine, so ``select_linear_paths`` times them on the device and keeps the fastest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

# rows <= bound -> bucket index; the last bucket takes everything larger
ROW_BUCKETS = (1, 8, 32)
PROBE_ROWS = (1, 6, 24, 192)
PATHS = ("linear", "transposed", "onednn")

_choices: dict[tuple[int, int, torch.dtype, str], tuple[str, ...]] = {}


def _bucket(rows: int) -> int:
    for i, bound in enumerate(ROW_BUCKETS):
        if rows <= bound:
            return i
    return len(ROW_BUCKETS)


class Linear(nn.Module):
    """``y = x @ W.T + b`` for x [T, in], through the path chosen for T's row bucket."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.paths: tuple[str, ...] = ("linear",) * (len(ROW_BUCKETS) + 1)
        self._transposed: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(self.paths[_bucket(x.shape[0])], x)

    def _run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        if path == "transposed" and self._transposed is not None:
            y = x @ self._transposed
            return y if self.bias is None else y + self.bias
        if path == "onednn" and self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def prepare(self, paths: tuple[str, ...]) -> None:
        """Build the weight layouts ``paths`` need and drop the others."""
        with torch.no_grad():
            w = self.weight.detach()
            self._transposed = w.t().contiguous() if "transposed" in paths else None
            self._packed = (
                torch.ops.mkldnn._reorder_linear_weight(w, None) if "onednn" in paths else None
            )
        self.paths = paths


def _onednn_usable(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and dtype in (torch.float32, torch.bfloat16)
    )


def _fastest(runs: Mapping[str, Callable[[], torch.Tensor]], rounds: int) -> str:
    """The key of the fastest run: rounds interleave the runs and each keeps its best time
    (the minimum is what a busy machine distorts least: noise only ever adds time)."""
    best = dict.fromkeys(runs, float("inf"))
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(rounds):
        for path, fn in runs.items():
            start = time.perf_counter()
            fn()
            best[path] = min(best[path], time.perf_counter() - start)
    return min(best, key=best.__getitem__)


def measure_paths(layer: Linear, rounds: int = 5) -> tuple[str, ...]:
    """The fastest path for each row bucket of this layer, measured now."""
    w = layer.weight
    candidates = ["linear", "transposed"]
    if _onednn_usable(w.device, w.dtype):
        candidates.append("onednn")
    layer.prepare(tuple(candidates))
    chosen = []
    for rows in PROBE_ROWS:
        x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
        with torch.inference_mode():
            runs = {path: partial(layer._run, path, x) for path in candidates}
            chosen.append(_fastest(runs, rounds))
    return tuple(chosen)


def select_linear_paths(model: nn.Module) -> None:
    """Choose and prepare the path per row bucket for every ``Linear`` in ``model``.

    On CUDA every layer keeps the plain path. Layers of one shape share a measurement,
    cached per process.
    """
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        w = module.weight
        if w.device.type != "cpu":
            module.prepare(("linear",) * (len(ROW_BUCKETS) + 1))
            continue
        key = (w.shape[0], w.shape[1], w.dtype, str(w.device))
        if key not in _choices:
            _choices[key] = measure_paths(module)
        module.prepare(_choices[key])
