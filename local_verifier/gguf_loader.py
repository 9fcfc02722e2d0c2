"""Read a GGUF file: model config, weights (HF names, read on demand) and tokenizer."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from local_verifier import families
from local_verifier.errors import ModelLoadError
from local_verifier.families import Family
from local_verifier.gguf_file import GGUFFile, TensorInfo
from local_verifier.gguf_tokenizer import tokenizer_from_metadata
from local_verifier.kernels.packing import QUANT_TYPES, quant_blocks
from local_verifier.model import ModelConfig
from local_verifier.tokenizer import Tokenizer
from local_verifier.weights import row_chunks


def _field(reader: GGUFFile | GGUFReader, key: str, default: Any = None) -> Any:
    if isinstance(reader, GGUFFile):
        return reader.fields.get(key, default)
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _family(reader: GGUFFile) -> tuple[str, Family]:
    """The file's architecture and the family that reads it; ``ModelLoadError`` where none
    does."""
    arch = _field(reader, "general.architecture")
    family = families.for_gguf(arch)
    if family is None:
        supported = ", ".join(families.gguf_architectures())
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")
    return arch, family


def read_config(reader: GGUFFile) -> ModelConfig:
    """ModelConfig from ``{arch}.*`` metadata (the family's layer differences by the
    family's ``gguf_config``)."""
    arch, family = _family(reader)

    def get(key: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    n_heads = int(get("attention.head_count"))
    dim = int(get("embedding_length"))
    if n_heads < 1:
        raise ModelLoadError(f"GGUF metadata {arch}.attention.head_count is {n_heads}")
    head_dim = int(get("attention.key_length", get("rope.dimension_count", dim // n_heads)))
    vocab = _field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    names = {t.name for t in reader.tensors}
    rope_scaling = None
    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        rope_scaling = {
            "rope_type": scaling_type,
            "factor": float(get("rope.scaling.factor")),
            "original_max_position_embeddings": int(
                get("rope.scaling.original_context_length", get("context_length"))
            ),
        }
    elif scaling_type not in (None, "none"):
        raise ModelLoadError(
            f"unsupported GGUF rope scaling {scaling_type!r}; supported: linear, yarn"
        )
    if "rope_freqs.weight" in names:
        rope_scaling = {"rope_type": "freq_factors"}
    context = int(get("context_length"))
    n_layers = int(get("block_count"))
    sizes = {
        "block_count": n_layers,
        "context_length": context,
        "embedding_length": dim,
        "attention.head_count": n_heads,
        "vocab_size": int(vocab),
    }
    for key, value in sizes.items():
        if value < 1:
            raise ModelLoadError(f"GGUF metadata {arch}.{key} is {value}; it must be positive")
    blocks = {name.split(".")[1] for name in names if name.startswith("blk.")}
    if n_layers != len(blocks):  # checked before any module is built for the count
        raise ModelLoadError(
            f"GGUF metadata {arch}.block_count is {n_layers} but the file holds tensors of "
            f"{len(blocks)} blocks"
        )
    fields: dict[str, Any] = {}
    window = _field(reader, f"{arch}.attention.sliding_window")
    if window:
        fields.update(sliding_window=int(window))
    common = {"dim": dim, "n_layers": n_layers, **fields}
    fields.update(family.gguf_config(lambda key: _field(reader, f"{arch}.{key}"), common))
    return ModelConfig(
        vocab_size=int(vocab),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        hidden_dim=int(get("feed_forward_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        max_seq_len=context,
        **fields,
    )


class GGUFSource:
    """The tensors of a GGUF file under Hugging Face names.

    A tensor is read from the file chunk by chunk of rows (plain reads: no page of the file
    stays resident) and each chunk reinterpreted (F32, F16, BF16) or dequantized by the gguf
    package, then written into its destination (cast once); llama's q/k rows go back to the
    rotate-half order as they are written, except those named in ``keep_pairs``, which keep
    the file's order (``in_pairs``). A tensor named in ``keep_blocks`` is read as its blocks
    instead: its shape is the ``quant`` one (``kernels.packing``) and its rows' bytes are
    copied as they are."""

    def __init__(self, path: Path, reader: GGUFFile, cfg: ModelConfig) -> None:
        _, family = _family(reader)
        self._path = path
        self._tensors: dict[str, tuple[TensorInfo, int | None]] = {}  # name: (tensor, heads)
        self._blocks: set[str] = set()
        self._pairs: set[str] = set()  # q/k tensors read in the file's row order
        self._map: tuple[mmap.mmap, int] | None = None  # copy-on-write map, its address
        for t in reader.tensors:
            if t.name == "rope_freqs.weight":  # read into the config by ``read_gguf``
                continue
            try:  # one row of zeros: the type is checked without reading the file
                dequantize(np.zeros_like(t.data[:1]), t.tensor_type)
            except NotImplementedError as exc:
                raise ModelLoadError(
                    f"tensor {t.name} has type {t.tensor_type.name}, which the gguf package "
                    "cannot dequantize"
                ) from exc
            name = families.gguf_tensor_name(family, t.name)
            if name is None:
                raise ModelLoadError(f"unexpected GGUF tensor {t.name}")
            heads = None
            if family.gguf_interleaved_qk and ".attn_q." in t.name:
                heads = cfg.n_heads
            elif family.gguf_interleaved_qk and ".attn_k." in t.name:
                heads = cfg.n_kv_heads
            self._tensors[name] = (t, heads)

    def shape(self, name: str) -> tuple[int, ...] | None:
        entry = self._tensors.get(name)
        if entry is None:
            return None
        dims = tuple(int(d) for d in reversed(entry[0].shape))
        if name in self._blocks:
            return quant_blocks(dims[0], dims[1], entry[0].tensor_type)
        return dims

    def block_type(self, name: str) -> GGMLQuantizationType | None:
        """The GGML type of a 2-D tensor whose blocks the C++ kernels run (``QUANT_TYPES``),
        else None."""
        entry = self._tensors.get(name)
        if entry is None or len(entry[0].shape) != 2 or entry[0].tensor_type not in QUANT_TYPES:
            return None
        return entry[0].tensor_type

    def tensor_type(self, name: str) -> GGMLQuantizationType | None:
        """The file's type of tensor ``name`` (None: no such tensor)."""
        entry = self._tensors.get(name)
        return None if entry is None else entry[0].tensor_type

    def keep_blocks(self, name: str) -> None:
        """Read ``name`` (a ``block_type`` tensor) as its blocks from now on."""
        self._blocks.add(name)

    def in_pairs(self, name: str) -> bool:
        """Whether ``name``'s rows lie in the file in llama's pair order: each head's rows
        of one rotated pair side by side (``2i + j`` is rotate-half order's ``i + j half``)."""
        entry = self._tensors.get(name)
        return entry is not None and entry[1] is not None

    def keep_pairs(self, name: str) -> None:
        """Read ``name`` (``in_pairs``) in the file's pair order from now on."""
        self._pairs.add(name)

    def lie_in_place(self, names: list[str]) -> bool:
        """Whether the rows of tensors ``names`` lie in the file as one run, in order: one
        tensor after the other, none whose rows the loader reorders (llama's q/k, unless
        ``keep_pairs``)."""
        entries = [self._tensors[n] for n in names]
        return all(self._heads(n) is None for n in names) and all(
            a.data_offset + a.n_bytes == b.data_offset
            for (a, _), (b, _) in zip(entries, entries[1:], strict=False)
        )

    def mapped(self, names: list[str]) -> torch.Tensor | None:
        """The blocks of tensors ``names`` (kept as blocks, ``lie_in_place``) as one uint8
        tensor in their ``quant`` shape over a copy-on-write map of the file: used in place,
        each page read when a step first reads it; None where they do not lie so."""
        if any(n not in self._blocks for n in names) or not self.lie_in_place(names):
            return None
        entries = [self._tensors[n] for n in names]
        if self._map is None:
            with self._path.open("rb") as f:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            self._map = mapping, torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
        shapes = [cast(tuple[int, ...], self.shape(n)) for n in names]
        count = sum(t.n_bytes for t, _ in entries)
        flat = torch.frombuffer(
            self._map[0], dtype=torch.uint8, count=count, offset=entries[0][0].data_offset
        )
        return flat.view(sum(shape[0] for shape in shapes), *shapes[0][1:])

    def _heads(self, name: str) -> int | None:
        """The heads whose rows the loader reorders as it reads ``name`` (None: none)."""
        return None if name in self._pairs else self._tensors[name][1]

    def read_into(self, name: str, out: torch.Tensor) -> None:
        t, heads = self._tensors[name][0], self._heads(name)
        if self._map is not None and out.data_ptr() == self._map[1] + t.data_offset:
            return  # ``mapped``: the file's own bytes
        if name in self._blocks and heads is None and out.is_contiguous():
            self._read_bytes(t, out)
            return
        stored = t.data  # the reader's memory map: its shape and dtype, no page read
        if name in self._blocks:
            stored = stored.reshape(out.shape[0] if heads is None else -1, *out.shape[1:])
        rows = stored.shape[0] if stored.ndim > 1 else 1
        row_bytes = t.n_bytes // rows
        whole = heads is not None or stored.ndim == 1  # permuted across rows, or a vector
        chunks = [(0, rows)] if whole else row_chunks(rows, out[0].numel() * 4)
        for start, end in chunks:
            count = (end - start) * row_bytes
            raw = np.fromfile(
                self._path, dtype=np.uint8, count=count, offset=t.data_offset + start * row_bytes
            )
            if raw.size != count:
                raise ModelLoadError(f"{self._path} is truncated (tensor {t.name})")
            shape = stored.shape if whole else (end - start, *stored.shape[1:])
            values = (
                torch.from_numpy(raw.reshape(shape))
                if name in self._blocks
                else _values(raw.view(stored.dtype).reshape(shape), t.tensor_type)
            )
            if heads is None:
                target = out if whole else out[start:end]
                target.copy_(values.reshape(target.shape))
            else:  # out's rows [head, 2, half] are the file's [head, half, 2]
                half = out.shape[0] // heads // 2
                rest = out.shape[1:]
                out.view(heads, 2, half, *rest).transpose(1, 2).copy_(
                    values.reshape(heads, half, 2, *rest)
                )

    def _read_bytes(self, t: TensorInfo, out: torch.Tensor) -> None:
        """Tensor ``t``'s bytes read straight into ``out`` (no buffer between: nothing
        transient for the allocator to keep)."""
        view = out.numpy().data.cast("B")
        with self._path.open("rb", buffering=0) as f:
            f.seek(t.data_offset)
            done = 0
            while done < t.n_bytes and (n := f.readinto(view[done:])):
                done += n
        if done != t.n_bytes:
            raise ModelLoadError(f"{self._path} is truncated (tensor {t.name})")


def _values(chunk: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    """A chunk of a GGUF tensor as a torch tensor: float types as they are, the others
    dequantized to float32."""
    if qtype == GGMLQuantizationType.BF16:  # bytes -> bfloat16 pairs
        return torch.from_numpy(chunk).view(torch.bfloat16)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(chunk)
    return torch.from_numpy(dequantize(chunk, qtype))


def read_gguf(path: Path) -> tuple[ModelConfig, GGUFSource, Tokenizer]:
    """Config, weights (HF names, read on demand) and tokenizer of a GGUF file."""
    try:
        reader = GGUFFile(path)
    except Exception as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    cfg = read_config(reader)
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        factors = dequantize(freqs.data, freqs.tensor_type).reshape(-1)
        cfg.rope_scaling = {"rope_type": "freq_factors", "factors": factors.tolist()}
    return cfg, GGUFSource(path, reader, cfg), read_tokenizer(reader)


def read_tokenizer(reader: GGUFFile | GGUFReader) -> Tokenizer:
    """The tokenizer of an open GGUF file."""
    arch = _field(reader, "general.architecture")
    return tokenizer_from_metadata(lambda key: _field(reader, key), arch)
