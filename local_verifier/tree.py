"""Tree attention layout for one verify forward over ``[root] + draft nodes``.

Sequence index 0 is the root (the last committed token, not yet in the KV cache); draft
node ``i`` sits at sequence index ``i + 1``. Each entry attends to itself and its
ancestors (the committed prefix is always visible to every entry, see ``Transformer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lookup.draft import depths


def tree_positions(
    parents: Sequence[int] | np.ndarray, prefix_len: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Position ids ``[k+1]``: root at ``prefix_len``, node at ``prefix_len + depth``."""
    pos = np.concatenate([[0], depths(parents)]) + prefix_len
    return torch.as_tensor(pos, dtype=torch.long, device=device)


def tree_mask(
    parents: Sequence[int] | np.ndarray, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Bool ``[k+1, k+1]``: entry ``[i, j]`` is True when ``j`` is ``i`` or an ancestor of it."""
    size = len(parents) + 1
    mask = np.zeros((size, size), dtype=bool)
    mask[0, 0] = True
    for node, parent in enumerate(parents):
        mask[node + 1] = mask[parent + 1]
        mask[node + 1, node + 1] = True
    return torch.as_tensor(mask, device=device)
