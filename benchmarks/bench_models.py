"""Draftgate at real model sizes, on random-weight checkpoints written here (no download).

    python -m benchmarks.bench_models [--shapes 1b,3b] [--dtype bf16] [--prefill 512] \
        [--max-tokens 32] [--repeats 5] [--rounds 1] [--load-only] [--gguf gguf-bf16,gguf-q8_0] \
        [--llamacpp BUILD_DIR] [--gguf-dtype native] [--shipped smollm2-135m,gemma3-270m] \
        [--shipped-dtypes native,bf16] [--threads N] [--spec-models smollm2-135m,gemma3-270m] \
        [--spec-limit 4] [--llama-repack 1] [--llama-no-amx] [--dir /tmp/bench-models] [--keep] \
        [--json FILE] [--smoke]

Each of ``--shapes`` (``1b``: Llama-3.2-1B's shapes, ``3b``: Llama-3.2-3B's, ``smoke``: a
tiny one; ``1b-smollm2``: 1.1B parameters, 30 layers of width 1,536 and 6,144 MLP units,
whose weights are SmolLM2-135M's widened with zeros (``benchmarks.widened``): the same
function, so its greedy text repeats what it is shown and drafts are accepted) is written
as a Llama checkpoint in safetensors (random bf16 weights, or the widened float32 ones, in shards,
with SmolLM2's byte-level BPE tokenizer, rebuilt from the installed SmolLM2 GGUF: a
vocabulary llama.cpp's converter knows; the ids past its 49152 tokens, up to Llama 3.2's
128256 rows of the embedding table, are unused padding), measured in a process of its own
on ``--threads`` threads (every usable CPU by default) once loaded. Reported per shape:

- ``load_s`` and ``peak_rss_mib`` of ``load_model(path, dtype=--dtype, kv_cache_mb=512)``
  as the engine calls it (rope tables for the positions its default K/V cache holds; the
  steps of its thread probe included; the process's VmHWM; ``rss_before_mib`` what the
  process held before it), ``weight_mib`` (the loaded weights' bytes) and
  ``peak_over_weights`` (peak / weights); ``peak_rss_after_step_mib`` after the timed steps;
  with ``--load-only``, ``engine_peak_rss_mib`` once an engine serves the model with its
  default K/V pool (``kv_pool_mib``, committed at start) and
  ``engine_peak_over_weights_and_pool`` ((that peak - before) / (weights + pool));
- ``step_1row_ms`` (a decode step after a 128-token context) beside ``floor_ms``: the bytes
  a token reads (every weight but the embedding table) over the machine's read bandwidth
  (``bench_decode.read_bandwidth``), and ``floor_over_step``;
- ``prefill_tok_s`` of a ``--prefill``-token prompt (``bench_decode.prefill``) and
  ``decode_tok_s`` of plain greedy decoding (``--max-tokens`` tokens after a 32-token
  prompt, ``generate_plain``): each the mean rate of ``--repeats`` runs after an untimed
  one, ``_stddev`` their standard deviation.

The same weights are then written as GGUF files (``--gguf``: BF16 and Q8_0). With
``--llamacpp BUILD_DIR`` (llama.cpp built there by ``benchmarks.bench_llamacpp``, built
first where it is not) the BF16 file is written by llama.cpp's own converter
(``convert_hf_to_gguf.py`` of that source, ``--outtype bf16``) and the Q8_0 file by
``llama-quantize`` from it; then for each file, one after the other (which first
alternating), ours (the figures above) and ``llama-bench`` on the same file (each in a
process of its own, on ``--threads`` threads): its decode rate ``-p 0 -n
--max-tokens -d 32`` (that many single-token steps after a 32-token context, the mean over
``--repeats`` runs) and its prompt rate ``-p --prefill -n 0``, with ours over llama.cpp's;
``--rounds N`` adds N - 1 rounds of the two decode rates alone (which first alternating),
the decode ratio then the median of the rounds' (``decode_rounds``): these VMs' speed drifts
over minutes.
``load_model`` dequantizes Q8_0 and rounds to ``--dtype``: our Q8_0 figures compute with
the bf16 values of the Q8_0 weights, llama.cpp's with Q8_0 itself. Without ``--llamacpp``
the files are written with gguf-py's writer and quantizer (as the converter uses them) and
only their load is measured; the JSON's ``llama_cpp`` says llama.cpp was not run.

``--keep`` leaves the GGUF files in ``--dir`` (``benchmarks.bench_llamacpp --gguf FILE``
runs code edits on one). ``--gguf gguf-q4_k_m`` adds a Q4_K_M file (``llama-quantize`` only: needs ``--llamacpp``);
``--gguf-dtype`` loads the GGUF files otherwise than ``--dtype`` (``native``: the quantized
blocks as the file holds them, no dequantized copy).

``--shipped smollm2-135m,gemma3-270m`` (with ``--llamacpp``): the same figures beside
``llama-bench`` on the shipped models' own GGUF files (SmolLM2 in Q4_1, Gemma 3 270M in
Q4_K_M), ours in each of ``--shipped-dtypes`` (``native,bf16``).

Then, for each of ``--spec-models`` that is installed, speculative vs plain decoding on the
workload's first ``--spec-limit`` code edits, in a process of its own: tokens/s of each, the
speed-up and whether every output is identical.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gguf
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import save_file

from benchmarks.bench_decode import prefill, read_bandwidth, step_ms, weight_bytes_per_token
from benchmarks.bench_llamacpp import (
    SDIST,
    build,
    convert,
    llama_bench,
    llama_quantize,
    llama_version,
)
from benchmarks.bench_speculative import run_plain, run_speculative
from benchmarks.harness import SPAWN, parse, workload, write_json
from benchmarks.widened import widened_config, widened_weights
from local_verifier.devices import available_cpus
from local_verifier.gguf_file import GGUFFile
from local_verifier.gguf_loader import read_tokenizer
from local_verifier.loader import LoadedModel, resolve_spec, smollm2_path

SMOKE = ("--shapes", "smoke", "--prefill", "64", "--max-tokens", "4", "--repeats", "2")
SMOKE += ("--bandwidth-gib", "0.125")
SMOKE += ("--spec-models", "smollm2-135m", "--spec-limit", "1", "--spec-max-tokens", "8")
MIB = 2**20
SHARD_BYTES = 512 * MIB
CONTEXT = 32  # the tokens before plain decoding starts (ours: a prompt; llama-bench: -d)
LLAMA_NOT_RUN = (
    "not run: --llamacpp BUILD_DIR runs llama-bench beside ours on the GGUF files; without "
    "it they are written with gguf-py's writer and only loaded"
)
TOKENIZER = (
    "SmolLM2's byte-level BPE (49152 tokens, from the installed SmolLM2 GGUF; llama.cpp's "
    "converter knows its pre-tokenizer); ids from 49152 up to vocab_size are unused padding"
)

# Llama 3.2's shapes and rope (https://huggingface.co/meta-llama/Llama-3.2-1B, -3B config.json)
LLAMA32 = {
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
}
GGUF_FORMATS = {"gguf-bf16": GGMLQuantizationType.BF16, "gguf-q8_0": GGMLQuantizationType.Q8_0}
# files only llama-quantize writes (gguf-py quantizes no K-quant): format -> its type name
LLAMA_ONLY_FORMATS = {"gguf-q4_k_m": "Q4_K_M"}
SHIPPED = ("smollm2-135m", "gemma3-270m")
SHAPES: dict[str, dict[str, Any]] = {
    "smoke": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 49152,  # the tokenizer's
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    "1b": {
        **LLAMA32,
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
    },
    "3b": {
        **LLAMA32,
        "hidden_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
    },
    # Llama-3.2-1B's parameter count (1.1B) computing SmolLM2-135M's function (widened.py):
    # a model whose greedy text repeats what it is shown, so drafts are accepted
    "1b-smollm2": widened_config(1536, 24, 6144),
}
WIDENED = {"1b-smollm2"}  # shapes whose weights are SmolLM2's widened, not random


def tensor_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors of a Llama checkpoint with ``cfg``, by Hugging Face name."""
    dim, hidden = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = dim // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg["vocab_size"], dim),
        "model.norm.weight": (dim,),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (dim,),
            p + "post_attention_layernorm.weight": (dim,),
            p + "self_attn.q_proj.weight": (q, dim),
            p + "self_attn.k_proj.weight": (kv, dim),
            p + "self_attn.v_proj.weight": (kv, dim),
            p + "self_attn.o_proj.weight": (dim, q),
            p + "mlp.gate_proj.weight": (hidden, dim),
            p + "mlp.up_proj.weight": (hidden, dim),
            p + "mlp.down_proj.weight": (dim, hidden),
        }
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], dim)
    return shapes


def random_weights(cfg: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The bf16 tensors of a random Llama checkpoint with ``cfg`` (the same every time)."""
    gen = torch.Generator().manual_seed(0)
    for name, dims in tensor_shapes(cfg).items():
        if name.endswith("norm.weight"):
            yield name, torch.ones(dims, dtype=torch.bfloat16)
        else:
            yield name, (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)


def shape_weights(shape: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of ``SHAPES[shape]``: SmolLM2's widened in float32 (``WIDENED``, its
    values as they are) or random in bf16."""
    cfg = SHAPES[shape]
    if shape in WIDENED:
        return widened_weights(tensor_shapes(cfg), cfg)
    return random_weights(cfg)


def write_checkpoint(directory: Path, shape: str) -> int:
    """The Llama checkpoint of ``SHAPES[shape]`` (``shape_weights``) in ``directory`` (shards
    of at most ``SHARD_BYTES``, an index, config, byte-level tokenizer); its bytes."""
    cfg = SHAPES[shape]
    directory.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}  # the writer holds one shard at a time
    weight_map: dict[str, str] = {}
    total = 0
    for name, value in shape_weights(shape):
        if shard and sum(v.nbytes for v in shard.values()) + value.nbytes > SHARD_BYTES:
            _save_shard(directory, shard, weight_map)
            shard = {}
        shard[name] = value
        total += value.nbytes
    _save_shard(directory, shard, weight_map)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **cfg}
    dtype = "float32" if shape in WIDENED else "bfloat16"
    (directory / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
    write_tokenizer(directory)
    return total


def _save_shard(
    directory: Path, shard: dict[str, torch.Tensor], weight_map: dict[str, str]
) -> None:
    name = f"model-{len(set(weight_map.values())):05d}.safetensors"
    save_file(shard, str(directory / name))
    weight_map.update(dict.fromkeys(shard, name))


def smollm2_gguf() -> GGUFFile:
    """The installed SmolLM2 GGUF, whose tokenizer the checkpoints take."""
    return GGUFFile(smollm2_path())


def write_tokenizer(directory: Path) -> None:
    """SmolLM2's tokenizer (and chat template) as ``tokenizer.json`` and
    ``tokenizer_config.json``."""
    tokenizer = read_tokenizer(smollm2_gguf())
    tokenizer.backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokenizer.special_tokens}
    config["chat_template"] = tokenizer.chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def write_gguf(path: Path, shape: str, qtype: GGMLQuantizationType) -> None:
    """The weights of ``write_checkpoint`` as a GGUF file, written as llama.cpp's converter
    writes one (gguf-py's writer; SmolLM2's tokenizer fields, padded to the vocabulary size
    with unused ``[PAD<id>]`` tokens; q/k rows in llama.cpp's rotary order; matrices in
    ``qtype``: BF16 as they are, Q8_0 quantized by gguf-py from the bf16 values)."""
    cfg = SHAPES[shape]
    fields = smollm2_gguf().fields
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_dimension_count(cfg["hidden_size"] // heads)
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    pad = range(len(tokens), cfg["vocab_size"])
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    writer.add_token_list([*tokens, *(f"[PAD{i}]" for i in pad)])
    types = fields["tokenizer.ggml.token_type"]
    writer.add_token_types([*types, *[gguf.TokenType.UNUSED] * len(pad)])
    writer.add_token_merges(fields["tokenizer.ggml.merges"])
    writer.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    for name, value in shape_weights(shape):
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if name.endswith((".self_attn.q_proj.weight", ".self_attn.k_proj.weight")):
            n = heads if ".q_proj." in name else kv_heads
            value = value.reshape(n, 2, -1, value.shape[1]).transpose(1, 2)
            value = value.reshape(-1, value.shape[-1])
        if value.dim() == 1:
            writer.add_tensor(gguf_name, value.float().numpy())
        elif qtype == GGMLQuantizationType.BF16:
            raw = value.to(torch.bfloat16).contiguous().view(torch.uint8).numpy()
            writer.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, quantize(value.float().numpy(), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def vm_hwm_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_shape(path: str, dtype: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Load, step, prefill and decode figures of the checkpoint at ``path`` (in a child; on
    ``opts["threads"]`` threads after loading)."""
    from local_verifier.engine import DEFAULT_KV_CACHE_MB
    from local_verifier.loader import load_model

    before = vm_hwm_mib()
    start = time.perf_counter()
    # as the engine calls it: its thread probe's steps too
    lm = load_model(path, dtype=dtype, kv_cache_mb=DEFAULT_KV_CACHE_MB)
    load_s = time.perf_counter() - start
    peak = vm_hwm_mib()
    torch.set_num_threads(opts["threads"])
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    out: dict[str, Any] = {
        "dtype": str(lm.dtype).removeprefix("torch."),
        "load_s": round(load_s, 2),
        "rss_before_mib": round(before),
        "peak_rss_mib": round(peak),
        "weight_mib": round(weights / MIB),
        "peak_over_weights": round(peak * MIB / weights, 3),
        "head_is_embedding": lm.model.head.weight is lm.model.embed.weight,
        "threads": torch.get_num_threads(),
    }
    if opts["load_only"]:
        return out | engine_rss(lm, before, weights)
    step = step_ms(lm, [1], opts["repeats"])[1]
    out["peak_rss_after_step_mib"] = round(vm_hwm_mib())
    bandwidth = max(read_bandwidth(gib=opts["bandwidth_gib"]).values())
    floor_ms = weight_bytes_per_token(lm) / bandwidth * 1e3
    length = opts["prefill"]
    prefill(lm, length, length)  # untimed, as llama-bench warms up
    prefills = [prefill(lm, length, length)["tok_s"] for _ in range(opts["repeats"])]
    return out | {
        "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "step_1row_ms": step,
        "floor_ms": round(floor_ms, 2),
        "floor_over_step": round(floor_ms / step, 3),
        **mean_sd("prefill_tok_s", prefills),
        **mean_sd("decode_tok_s", decode_rates(lm, opts["max_tokens"], opts["repeats"])),
    }


def engine_rss(lm: LoadedModel, before: float, weights: int) -> dict[str, Any]:
    """The process's peak once an engine serves ``lm`` with the default K/V pool (committed
    at start, its start-up step measurements run), over the weights plus that pool: the
    measure of "peak RSS within 1.1x the file plus the KV pool"."""
    from local_verifier.engine import DEFAULT_KV_CACHE_MB, Engine

    engine = Engine(lm, kv_cache_mb=DEFAULT_KV_CACHE_MB)
    try:
        peak = vm_hwm_mib()
    finally:
        engine.close()
    pool = engine.pool.storage.nbytes()
    return {
        "engine_peak_rss_mib": round(peak),
        "kv_pool_mib": round(pool / MIB),
        "engine_peak_over_weights_and_pool": round((peak - before) * MIB / (weights + pool), 3),
    }


def decode_rates(lm: LoadedModel, max_tokens: int, repeats: int) -> list[float]:
    """Tokens/s of each of ``repeats`` plain greedy decodes of ``max_tokens`` tokens after a
    ``CONTEXT``-token prompt, after an untimed one (the tokens after the first over the
    time after the prompt pass; a run that ends on its first token has none)."""
    ids = list(range(1, CONTEXT + 1))
    run_plain(lm, ids, max_tokens)
    rates = []
    for _ in range(repeats):
        plain = run_plain(lm, ids, max_tokens)
        decoded = len(plain["ids"]) - 1  # the first token comes from the prompt pass
        if decoded > 0:
            rates.append(decoded / plain["decode"])
    return rates


def mean_sd(key: str, rates: list[float]) -> dict[str, float | None]:
    """``key``: the mean of ``rates`` (as llama-bench reports), ``key_stddev``: their
    standard deviation."""
    return {
        key: round(statistics.mean(rates), 2) if rates else None,
        f"{key}_stddev": round(statistics.stdev(rates), 2) if len(rates) > 1 else None,
    }


def measure_speculative(model: str, limit: int, max_tokens: int) -> dict[str, Any]:
    """Speculative vs plain on the workload's first ``limit`` code edits (in a child)."""
    from benchmarks.bench_speculative import document
    from local_verifier.engine import Engine, GenerationRequest
    from local_verifier.errors import ModelLoadError
    from local_verifier.loader import load_model

    try:
        lm = load_model(model)
    except ModelLoadError as exc:
        return {"skipped": str(exc)}
    engine = Engine(lm)
    tokens = {"plain": 0, "speculative": 0}
    wall = {"plain": 0.0, "speculative": 0.0}
    identical = 0
    records = workload(categories=["code_edit"], limit=limit)
    for n, record in enumerate(records):
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(record.messages))
        cap = min(max_tokens, record.max_tokens)
        req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=cap,
            prediction=record.prediction,
            documents=[document(lm, d["text"]) for d in record.documents or []],
        )
        runs = {}
        for side in ("plain", "speculative") if n % 2 == 0 else ("speculative", "plain"):
            runs[side] = (
                run_plain(lm, ids, cap) if side == "plain" else run_speculative(engine, req)
            )
            tokens[side] += len(runs[side]["ids"])
            wall[side] += runs[side]["wall"]
        identical += runs["plain"]["ids"] == runs["speculative"]["ids"]
    engine.close()
    tps = {side: round(tokens[side] / wall[side], 1) for side in tokens}
    return {
        "code_edits": len(records),
        "tok_s": tps,
        "speedup": round(tps["speculative"] / tps["plain"], 2),
        "identical": f"{identical}/{len(records)}",
    }


def write_ggufs(
    checkpoint: Path, out: Path, shape: str, formats: list[str], llamacpp: tuple[Path, Path] | None
) -> dict[str, tuple[Path, str]]:
    """Each of ``formats``' GGUF file of the checkpoint in ``out`` and how it was written:
    with ``llamacpp`` (its build and binaries' directories) by llama.cpp's converter (BF16)
    and ``llama-quantize`` from that (the others), else by ``write_gguf``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {fmt: out / f"{shape}-{fmt}.gguf" for fmt in formats}
    if llamacpp is None:
        unwritable = [fmt for fmt in formats if fmt in LLAMA_ONLY_FORMATS]
        if unwritable:
            raise SystemExit(
                f"{', '.join(unwritable)}: written by llama-quantize: needs --llamacpp"
            )
        for fmt, path in files.items():
            write_gguf(path, shape, GGUF_FORMATS[fmt])
        return {fmt: (path, "gguf-py's GGUFWriter and gguf.quants") for fmt, path in files.items()}
    build_dir, bin_dir = llamacpp
    bf16 = out / f"{shape}-gguf-bf16.gguf"
    convert(build_dir, checkpoint, bf16, "bf16")
    written = {"gguf-bf16": (bf16, "llama.cpp's convert_hf_to_gguf.py --outtype bf16")}
    for fmt in formats:
        if fmt != "gguf-bf16":
            quant = LLAMA_ONLY_FORMATS.get(fmt) or GGUF_FORMATS[fmt].name
            llama_quantize(bin_dir, bf16, files[fmt], quant)
            written[fmt] = (files[fmt], f"llama-quantize {quant} of the BF16 file")
    return {fmt: written[fmt] for fmt in formats}


def measure_decode(path: str, dtype: str, opts: dict[str, Any]) -> dict[str, Any]:
    """``decode_tok_s`` alone (``measure_shape``'s plain decoding, in a child)."""
    from local_verifier.loader import load_model

    lm = load_model(path, dtype=dtype, tune_threads=False)
    torch.set_num_threads(opts["threads"])
    return mean_sd("decode_tok_s", decode_rates(lm, opts["max_tokens"], opts["repeats"]))


def beside_llama(
    path: Path, dtype: str, opts: dict[str, Any], bin_dir: Path, ours_first: bool
) -> dict[str, Any]:
    """Our figures of the GGUF file at ``path`` and ``llama-bench``'s decode and prompt rates
    on it (each in a process of its own, in turn), and ours over llama.cpp's; then
    ``opts["rounds"] - 1`` more rounds of the two decode rates alone, which side first
    alternating: ``decode_rounds`` each round's pair and ratio, ``decode_ours_over_llama``
    their median (a VM's speed drifts over minutes: a ratio of rates taken one after the
    other moves with it)."""
    bench = partial(llama_bench, bin_dir, path, opts["threads"], opts["repeats"])
    repack = ["--repack", str(opts["llama_repack"])]
    decode = ["-p", "0", "-n", str(opts["max_tokens"]), "-d", str(CONTEXT), *repack]
    sides: dict[str, dict[str, Any]] = {}
    for side in ("ours", "llama") if ours_first else ("llama", "ours"):
        if side == "ours":
            sides[side] = in_child(measure_shape, str(path), dtype, opts)
        else:
            sides[side] = {
                "decode": bench(decode),
                "prefill": bench(["-p", str(opts["prefill"]), "-n", "0", *repack]),
            }
    ours, llama = sides["ours"], sides["llama"]
    rounds = [(ours.get("decode_tok_s"), llama["decode"]["tok_s"])]
    for n in range(1, opts["rounds"]):
        pair: dict[str, float | None] = {}
        for side in ("ours", "llama") if (n % 2 == 0) == ours_first else ("llama", "ours"):
            if side == "ours":
                pair[side] = in_child(measure_decode, str(path), dtype, opts).get("decode_tok_s")
            else:
                pair[side] = bench(decode)["tok_s"]
        rounds.append((pair["ours"], pair["llama"]))
    ratios = [round(o / t, 3) for o, t in rounds if o is not None]

    def ratio(ours_key: str, llama_key: str) -> float | None:
        value = ours.get(ours_key)
        return None if value is None else round(value / llama[llama_key]["tok_s"], 3)

    return ours | {
        "llama_cpp": llama,
        "decode_rounds": [{"ours": o, "llama": t} for o, t in rounds],
        "decode_ours_over_llama": round(statistics.median(ratios), 3) if ratios else None,
        "prefill_ours_over_llama": ratio("prefill_tok_s", "prefill"),
    }


def shipped_beside_llama(
    models: list[str], dtypes: list[str], opts: dict[str, Any], bin_dir: Path
) -> dict[str, Any]:
    """``beside_llama`` on each shipped model's own GGUF file, ours in each of ``dtypes``
    (``native``: its quantized blocks as they are), which side first alternating."""
    out: dict[str, Any] = {}
    for model in models:
        path, _ = resolve_spec(model)
        entry = out[model] = {"file": path.name, "file_mib": round(path.stat().st_size / MIB)}
        for n, dtype in enumerate(dtypes):
            entry[dtype] = beside_llama(path, dtype, opts, bin_dir, n % 2 == 0)
            print(model, dtype, json.dumps(entry[dtype]), flush=True)
    return out


def _child(conn: Any, target: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    conn.send(target(*args))


def in_child(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``target(*args)`` in a spawned process of its own (its memory figures its own)."""
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_child, args=(child, target, args))
    proc.start()
    child.close()
    try:
        result: dict[str, Any] = parent.recv()
    except EOFError:  # it died before sending
        result = {}
    proc.join()
    return result or {"error": f"the measuring process exited with code {proc.exitcode}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="1b,3b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--prefill", type=int, default=512, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=32, help="plain decode tokens")
    parser.add_argument(
        "--repeats", type=int, default=5, help="1-row steps, prompts, decodes timed"
    )
    parser.add_argument("--load-only", action="store_true", help="load time and peak RSS only")
    parser.add_argument(
        "--rounds", type=int, default=1, help="decode rates beside llama-bench: rounds, in turn"
    )
    parser.add_argument("--bandwidth-gib", type=float, default=1.0, help="bandwidth probe size")
    parser.add_argument(
        "--gguf", default=",".join(GGUF_FORMATS), help="GGUF files of the same weights measured"
    )
    parser.add_argument(
        "--llamacpp",
        type=Path,
        default=None,
        metavar="BUILD_DIR",
        help="llama.cpp's build (benchmarks.bench_llamacpp --build-dir; built where it is "
        "not): its converter writes the GGUF files and llama-bench runs beside ours on them",
    )
    parser.add_argument(
        "--threads", type=int, default=available_cpus(), help="ours (after loading) and llama.cpp's"
    )
    parser.add_argument(
        "--gguf-dtype", default=None, help="ours on the GGUF files (default: --dtype), e.g. native"
    )
    parser.add_argument(
        "--shipped",
        default="",
        help=f"of {','.join(SHIPPED)}: their own GGUF files beside llama-bench (needs --llamacpp)",
    )
    parser.add_argument("--shipped-dtypes", default="native,bf16", help="ours on --shipped")
    parser.add_argument(
        "--llama-repack",
        type=int,
        choices=(0, 1),
        default=1,
        help="llama-bench's --repack: 0 where its repacked AMX int8 path dies (SIGSEGV with a "
        "context on a 2-core Sapphire Rapids VM)",
    )
    parser.add_argument(
        "--llama-no-amx",
        action="store_true",
        help="llama.cpp built without its AMX kernels (in BUILD_DIR/build-no-amx), so that "
        "--llama-repack 1 runs on its AVX-512 kernels where its AMX path faults",
    )
    parser.add_argument("--spec-models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--spec-limit", type=int, default=4, help="code edits per model")
    parser.add_argument("--spec-max-tokens", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-models"))
    parser.add_argument(
        "--keep", action="store_true", help="keep the GGUF files (in --dir/SHAPE-gguf)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parse(parser, SMOKE)
    names = (
        "prefill", "max_tokens", "repeats", "load_only", "bandwidth_gib", "threads", "llama_repack",
        "rounds",
    )  # fmt: skip
    opts = {k: getattr(args, k) for k in names}
    bin_dir = (
        None if args.llamacpp is None else build(args.llamacpp, None, amx=not args.llama_no_amx)
    )
    llamacpp = None if bin_dir is None else (args.llamacpp, bin_dir)
    result: dict[str, Any] = {
        "tokenizer": TOKENIZER,
        "llama_cpp": LLAMA_NOT_RUN,
        "shapes": {},
        "speculative": {},
    }
    if bin_dir is not None:
        result["llama_cpp"] = {
            "source": f"{SDIST}'s vendored llama.cpp, {llama_version(bin_dir)}",
            "decode": f"llama-bench -p 0 -n {args.max_tokens} -d {CONTEXT}",
            "prefill": f"llama-bench -p {args.prefill} -n 0",
            "threads": args.threads,
            "repeats": args.repeats,
        }
    formats = [f for f in args.gguf.split(",") if f]
    unknown = set(formats) - set(GGUF_FORMATS) - set(LLAMA_ONLY_FORMATS)
    if unknown:
        parser.error(f"--gguf: unknown {', '.join(sorted(unknown))}")
    shipped = [m for m in args.shipped.split(",") if m]
    if shipped and bin_dir is None:
        parser.error("--shipped needs --llamacpp BUILD_DIR")
    if set(shipped) - set(SHIPPED):
        parser.error(f"--shipped: of {', '.join(SHIPPED)}")
    gguf_dtype = args.gguf_dtype or args.dtype
    for shape in filter(None, args.shapes.split(",")):
        directory, gguf_dir = args.dir / shape, args.dir / f"{shape}-gguf"
        for d in (directory, gguf_dir):
            shutil.rmtree(d, ignore_errors=True)
        try:
            try:
                written = write_checkpoint(directory, shape)
                figures = in_child(measure_shape, str(directory), args.dtype, opts)
                entry = result["shapes"][shape] = {
                    "checkpoint_mib": round(written / MIB),
                    **figures,
                }
                print(shape, json.dumps(entry), flush=True)
                files = write_ggufs(directory, gguf_dir, shape, formats, llamacpp)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            for n, (fmt, (path, writer)) in enumerate(files.items()):
                head = {"file_mib": round(path.stat().st_size / MIB), "writer": writer}
                if bin_dir is None or args.load_only:
                    load_only = {**opts, "load_only": True}
                    figures = in_child(measure_shape, str(path), gguf_dtype, load_only)
                else:
                    figures = beside_llama(path, gguf_dtype, opts, bin_dir, n % 2 == 0)
                entry[fmt] = head | figures
                print(shape, fmt, json.dumps(entry[fmt]), flush=True)
        finally:
            if not args.keep:
                shutil.rmtree(gguf_dir, ignore_errors=True)
    if bin_dir is not None:
        result["shipped"] = shipped_beside_llama(
            shipped, args.shipped_dtypes.split(","), opts, bin_dir
        )
    for model in filter(None, args.spec_models.split(",")):
        figures = in_child(measure_speculative, model, args.spec_limit, args.spec_max_tokens)
        result["speculative"][model] = figures
        print(model, json.dumps(figures), flush=True)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
