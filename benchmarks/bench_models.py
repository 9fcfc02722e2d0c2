"""Draftgate at real model sizes, on random-weight checkpoints written here (no download).

    python -m benchmarks.bench_models [--shapes 1b,3b] [--dtype bf16] [--prefill 512] \
        [--max-tokens 32] [--repeats 5] [--load-only] [--gguf gguf-bf16,gguf-q8_0] \
        [--spec-models smollm2-135m,gemma3-270m] [--spec-limit 4] [--dir /tmp/bench-models] \
        [--json FILE] [--smoke]

Each of ``--shapes`` (``1b``: Llama-3.2-1B's shapes, ``3b``: Llama-3.2-3B's, ``smoke``: a
tiny one) is written as a Llama checkpoint in bf16 safetensors (random weights, in shards,
with a byte-level tokenizer), measured in a process of its own, then deleted. Reported per
shape:

- ``load_s`` and ``peak_rss_mib`` of ``load_model(path, dtype=--dtype)`` as a user calls it
  (the steps of its thread probe included; the process's VmHWM; ``rss_before_mib`` what the
  process held before it), ``weight_mib`` (the loaded weights' bytes) and
  ``peak_over_weights`` (peak / weights); ``peak_rss_after_step_mib`` after the timed steps;
- ``step_1row_ms`` (a decode step after a 128-token context) beside ``floor_ms``: the bytes
  a token reads (every weight but the embedding table) over the machine's read bandwidth
  (``bench_decode.read_bandwidth``), and ``floor_over_step``;
- ``prefill_tok_s`` of a ``--prefill``-token prompt (``bench_decode.prefill``) and
  ``decode_tok_s`` of plain greedy decoding (``--max-tokens`` tokens after a 32-token
  prompt, ``generate_plain``).

The same weights are then written as GGUF files (``--gguf``: BF16, and Q8_0 quantized from
the bf16 values, with gguf-py's writer and quantizer as llama.cpp's converter uses them; the
converter itself refuses the random checkpoint's tokenizer) and each one's load measured
the same way (``load_model`` dequantizes Q8_0 and rounds to ``--dtype``). llama.cpp itself
is not run beside them (it needs a build: ``benchmarks.bench_llamacpp``); the JSON says so.

Then, for each of ``--spec-models`` that is installed, speculative vs plain decoding on the
workload's first ``--spec-limit`` code edits, in a process of its own: tokens/s of each, the
speed-up and whether every output is identical.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from benchmarks.bench_decode import prefill, read_bandwidth, step_ms, weight_bytes_per_token
from benchmarks.bench_speculative import run_plain, run_speculative
from benchmarks.harness import SPAWN, parse, workload, write_json

SMOKE = ("--shapes", "smoke", "--prefill", "64", "--max-tokens", "4", "--repeats", "2")
SMOKE += ("--bandwidth-gib", "0.125")
SMOKE += ("--spec-models", "smollm2-135m", "--spec-limit", "1", "--spec-max-tokens", "8")
MIB = 2**20
EOS = "<|end|>"
SHARD_BYTES = 512 * MIB
LLAMA_NOT_RUN = (
    "not measured: this benchmark does not run llama.cpp (benchmarks.bench_llamacpp builds "
    "and runs it); the GGUF files of these weights are written and loaded here"
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
SHAPES: dict[str, dict[str, Any]] = {
    "smoke": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
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
}


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


def write_checkpoint(directory: Path, shape: str) -> int:
    """A random-weight bf16 Llama checkpoint of ``SHAPES[shape]`` in ``directory`` (shards
    of at most ``SHARD_BYTES``, an index, config, byte-level tokenizer); its bytes."""
    cfg = SHAPES[shape]
    directory.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}  # the writer holds one shard at a time
    weight_map: dict[str, str] = {}
    total = 0
    for name, value in random_weights(cfg):
        if shard and sum(v.nbytes for v in shard.values()) + value.nbytes > SHARD_BYTES:
            _save_shard(directory, shard, weight_map)
            shard = {}
        shard[name] = value
        total += value.nbytes
    _save_shard(directory, shard, weight_map)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **cfg}
    (directory / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    write_tokenizer(directory)
    return total


def _save_shard(
    directory: Path, shard: dict[str, torch.Tensor], weight_map: dict[str, str]
) -> None:
    name = f"model-{len(set(weight_map.values())):05d}.safetensors"
    save_file(shard, str(directory / name))
    weight_map.update(dict.fromkeys(shard, name))


def tokenizer_tokens() -> tuple[list[str], list[tuple[str, str]]]:
    """The vocabulary (the 256 bytes, one merge, ``EOS``) and merges of the checkpoints'
    byte-level BPE tokenizer."""
    return [*sorted(pre_tokenizers.ByteLevel.alphabet()), "ab", EOS], [("a", "b")]


def write_tokenizer(directory: Path) -> None:
    """The byte-level BPE tokenizer of ``tokenizer_tokens``."""
    tokens, merges = tokenizer_tokens()
    vocab = {t: i for i, t in enumerate(tokens[:-1])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))


def write_gguf(path: Path, shape: str, qtype: GGMLQuantizationType) -> int:
    """The weights of ``write_checkpoint`` as a GGUF file, written as llama.cpp's converter
    writes one (gguf-py's writer; q/k rows in llama.cpp's rotary order; matrices in
    ``qtype``: BF16 as they are, Q8_0 quantized by gguf-py from the bf16 values); its bytes."""
    cfg = SHAPES[shape]
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
    tokens, merges = tokenizer_tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # the end token is a control one
    writer.add_token_merges([" ".join(m) for m in merges])
    writer.add_eos_token_id(len(tokens) - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    for name, value in random_weights(cfg):
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if name.endswith((".self_attn.q_proj.weight", ".self_attn.k_proj.weight")):
            n = heads if ".q_proj." in name else kv_heads
            value = value.reshape(n, 2, -1, value.shape[1]).transpose(1, 2)
            value = value.reshape(-1, value.shape[-1])
        if value.dim() == 1:
            writer.add_tensor(gguf_name, value.float().numpy())
        elif qtype == GGMLQuantizationType.BF16:
            raw = value.contiguous().view(torch.uint8).numpy()
            writer.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, quantize(value.float().numpy(), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


def vm_hwm_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_shape(path: str, dtype: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Load, step, prefill and decode figures of the checkpoint at ``path`` (in a child)."""
    from local_verifier.loader import load_model

    before = vm_hwm_mib()
    start = time.perf_counter()
    lm = load_model(path, dtype=dtype)  # as a user calls it: its thread probe's steps too
    load_s = time.perf_counter() - start
    peak = vm_hwm_mib()
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    out: dict[str, Any] = {
        "dtype": str(lm.dtype).removeprefix("torch."),
        "load_s": round(load_s, 2),
        "rss_before_mib": round(before),
        "peak_rss_mib": round(peak),
        "weight_mib": round(weights / MIB),
        "peak_over_weights": round(peak * MIB / weights, 3),
        "head_is_embedding": lm.model.head.weight is lm.model.embed.weight,
    }
    if opts["load_only"]:
        return out
    step = step_ms(lm, [1], opts["repeats"])[1]
    out["peak_rss_after_step_mib"] = round(vm_hwm_mib())
    bandwidth = max(read_bandwidth(gib=opts["bandwidth_gib"]).values())
    floor_ms = weight_bytes_per_token(lm) / bandwidth * 1e3
    ids = list(range(1, 33))
    plain = run_plain(lm, ids, opts["max_tokens"])
    decoded = len(plain["ids"]) - 1  # the first token comes from the prompt pass
    return out | {
        "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "step_1row_ms": step,
        "floor_ms": round(floor_ms, 2),
        "floor_over_step": round(floor_ms / step, 3),
        "prefill_tok_s": prefill(lm, opts["prefill"], opts["prefill"])["tok_s"],
        "decode_tok_s": round(decoded / plain["decode"], 2) if decoded > 0 else None,
        "llama_cpp": LLAMA_NOT_RUN,
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
    parser.add_argument("--repeats", type=int, default=5, help="1-row steps timed")
    parser.add_argument("--load-only", action="store_true", help="load time and peak RSS only")
    parser.add_argument("--bandwidth-gib", type=float, default=1.0, help="bandwidth probe size")
    parser.add_argument(
        "--gguf", default=",".join(GGUF_FORMATS), help="GGUF files of the same weights loaded too"
    )
    parser.add_argument("--spec-models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--spec-limit", type=int, default=4, help="code edits per model")
    parser.add_argument("--spec-max-tokens", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-models"))
    parser.add_argument("--json", type=Path, default=None)
    args = parse(parser, SMOKE)
    names = ("prefill", "max_tokens", "repeats", "load_only", "bandwidth_gib")
    opts = {k: getattr(args, k) for k in names}
    result: dict[str, Any] = {"shapes": {}, "speculative": {}}
    for shape in args.shapes.split(","):
        directory = args.dir / shape
        shutil.rmtree(directory, ignore_errors=True)
        try:
            written = write_checkpoint(directory, shape)
            figures = in_child(measure_shape, str(directory), args.dtype, opts)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        result["shapes"][shape] = {"checkpoint_mib": round(written / MIB), **figures}
        print(shape, json.dumps(result["shapes"][shape]), flush=True)
        for fmt in filter(None, args.gguf.split(",")):
            path = args.dir / f"{shape}-{fmt}.gguf"
            try:
                written = write_gguf(path, shape, GGUF_FORMATS[fmt])
                load_only = {**opts, "load_only": True}
                figures = in_child(measure_shape, str(path), args.dtype, load_only)
            finally:
                path.unlink(missing_ok=True)
            result["shapes"][shape][fmt] = {"file_mib": round(written / MIB), **figures}
            print(shape, fmt, json.dumps(result["shapes"][shape][fmt]), flush=True)
    for model in filter(None, args.spec_models.split(",")):
        figures = in_child(measure_speculative, model, args.spec_limit, args.spec_max_tokens)
        result["speculative"][model] = figures
        print(model, json.dumps(figures), flush=True)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
