"""A Llama-family step on the Triton kernels, captured in CUDA graphs per row bucket.

``TritonStack.forward`` runs embedding, every layer and the head over fixed buffers
(``StepBuffers``): the bias and the attention's residual add ride in the linear epilogues,
the MLP's residual add in the next norm, the SiLU-mul in the gate/up projection. ``StepGraphs`` pads a step to
the next row bucket (1, 2, 4, ...), copies its inputs into the bucket's buffers in one
transfer and replays the bucket's graph (captured at first use on CUDA; run eagerly
elsewhere, or past the largest bucket). Padding rows write no K/V (their slot is -1) and
attend to nothing; since every kernel computes a row from that row's inputs alone, they
cannot change a real row's bits, and replay equals the eager run.
"""

from __future__ import annotations

import torch

from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.stack_weights import StackWeights
from local_verifier.kernels.triton_ops import KeyLists, TritonOps

GRAPH_ROWS = 256
"""Rows of the largest bucket captured; a larger step (a long prompt chunk) runs eagerly on
the same kernels, with the same bits."""
PAD_SLOT = -1
"""The slot a padding row's K/V would go to: the rope/store kernel writes nothing there."""


class StepBuffers:
    """One bucket's inputs and output on the device. Inputs live in one int64 tensor
    (tokens, positions, slots, key starts, key lengths, then the joined key lists) so a
    step's inputs arrive in one copy."""

    def __init__(self, rows: int, max_keys: int, vocab: int, device: torch.device) -> None:
        self.rows, self.max_keys = rows, max_keys
        self.packed = torch.zeros(5 * rows + max_keys, dtype=torch.int64, device=device)
        self.tokens, self.positions, self.slots, self.start, self.length = (
            self.packed[: 5 * rows].view(5, rows).unbind(0)
        )
        self.keys = self.packed[5 * rows :]
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)

    def fill(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, lists: KeyLists
    ) -> None:
        """The step's rows, padded to the bucket, in one host-to-device copy."""
        n, used = tokens.shape[0], lists.keys.shape[0]
        host = torch.zeros(5 * self.rows + used, dtype=torch.int64)
        table = host[: 5 * self.rows].view(5, self.rows)
        table[0, :n] = tokens.cpu()
        table[1, :n] = positions.cpu()
        table[2, :n] = slots.cpu()
        table[2, n:] = PAD_SLOT
        table[3, :n] = lists.start.cpu()
        table[4, :n] = lists.length.cpu()  # padding rows: no keys
        host[5 * self.rows :] = lists.keys.cpu()
        if self.packed.device.type == "cuda":
            host = host.pin_memory()
        self.packed[: host.shape[0]].copy_(host, non_blocking=True)


class TritonStack:
    """The step of a Llama-family model (pre-norm blocks, SwiGLU) on the Triton kernels."""

    def __init__(self, weights: StackWeights, ops: TritonOps | None = None) -> None:
        self.w = weights
        self.ops = ops or TritonOps()

    def forward(self, buf: StepBuffers, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Logits of every row of ``buf`` (float32, into ``buf.logits``); writes K/V of
        layer i into ``k[i]``, ``v[i]``. Runs only device work (it is what a graph holds)."""
        w, ops = self.w, self.ops
        lists = KeyLists(buf.keys, buf.start, buf.length)
        cos = w.rope_cos.index_select(0, buf.positions)
        sin = w.rope_sin.index_select(0, buf.positions)
        x = w.embed.index_select(0, buf.tokens)
        h = ops.rms_norm(x, w.layers[0].attn_norm, w.layers[0].attn_eps)
        for i, layer in enumerate(w.layers):
            qkv = ops.linear(h, layer.wqkv, layer.bqkv)
            q = ops.rope_store(qkv, cos, sin, k[i], v[i], buf.slots, w.n_heads, w.n_kv_heads)
            att = ops.attend(q, k[i], v[i], lists)
            x = ops.linear(att.view(att.shape[0], -1), layer.wo, None, residual=x)
            h = ops.rms_norm(x, layer.ffn_norm, layer.ffn_eps)
            f = ops.linear(ops.linear_silu_mul(h, layer.w13), layer.w2, None)
            norm, eps = (
                (w.layers[i + 1].attn_norm, w.layers[i + 1].attn_eps)
                if i + 1 < len(w.layers)
                else (w.norm, w.norm_eps)
            )
            h, x = ops.add_rms_norm(f, x, norm, eps)
        buf.logits.copy_(ops.linear(h, w.head, None))
        return buf.logits


def buckets(max_rows: int) -> list[int]:
    """Row buckets 1, 2, 4, ... up to the first power of two holding ``max_rows``."""
    sizes = [1]
    while sizes[-1] < max_rows:
        sizes.append(sizes[-1] * 2)
    return sizes


class StepGraphs:
    """Steps padded to row buckets; on CUDA (with ``capture``) each bucket's step is a
    captured graph, else it runs eagerly on the same kernels."""

    def __init__(
        self,
        stack: TritonStack,
        k: torch.Tensor,
        v: torch.Tensor,
        max_rows: int,
        max_keys: int,
        capture: bool = True,
    ) -> None:
        self.stack, self.k, self.v = stack, k, v
        self.capture = capture and k.device.type == "cuda"
        self.sizes = buckets(max_rows)
        self.max_keys = max_keys
        self.device = k.device
        self._buffers: dict[int, StepBuffers] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def bucket(self, rows: int) -> int | None:
        """The smallest bucket holding ``rows``, or None past the largest."""
        return next((b for b in self.sizes if b >= rows), None)

    def run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        """Logits [rows, V] of the step's rows (float32)."""
        n = tokens.shape[0]
        lists = KeyLists.of(plan, torch.device("cpu"))
        size = self.bucket(n) or n
        if size not in self._buffers:
            keys = max(self.max_keys * size, lists.keys.shape[0])
            vocab = self.stack.w.head.shape[0]
            self._buffers[size] = StepBuffers(size, keys, vocab, self.device)
        buf = self._buffers[size]
        if lists.keys.shape[0] > buf.keys.shape[0]:
            raise ValueError(f"{lists.keys.shape[0]} keys exceed the bucket's {buf.max_keys}")
        buf.fill(tokens, positions, slots, lists)
        if not self.capture or size not in self.sizes:
            self.stack.forward(buf, self.k, self.v)
        else:
            if size not in self._graphs:
                self._graphs[size] = self._capture(buf)
            self._graphs[size].replay()
        return buf.logits[:n].clone()  # the buffer is the next step's

    def _capture(self, buf: StepBuffers) -> torch.cuda.CUDAGraph:
        # Capturing runs no kernel, but warming up does: its padding rows only (slot -1)
        # write nothing, and the real rows it runs are this step's, rewritten by the replay.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.stack.forward(buf, self.k, self.v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.stack.forward(buf, self.k, self.v)
        return graph
