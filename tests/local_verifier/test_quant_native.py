"""GGUF quantized weights run as blocks (``dtype="native"``): every type the C++ kernels take,
on tiny files written here (the gguf package's quantizers where it has them, else blocks of
valid random fields), bitwise the same for a row alone, batched, in prompt chunks, in draft
trees, fused or op by op, on one thread or two; close to the same weights dequantized. The
linear kernel itself: each row's bits at every row count, nothing read past a weight."""

from __future__ import annotations

import ctypes
import json
import mmap
from dataclasses import replace
from pathlib import Path
from typing import cast

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file
from torch import nn

from local_verifier.devices import blocks_by_default, resolve_dtype
from local_verifier.errors import ModelLoadError
from local_verifier.kernels.cpp import CppOps, load_library
from local_verifier.kernels.packing import (
    QUANT_TYPES,
    dequantized,
    gather_rows,
    layout_of,
    quant_type,
)
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear
from local_verifier.loader import LoadedModel, load_model, resolve_spec
from local_verifier.model import Block, SeqStep, Transformer
from tests.local_verifier.conftest import write_tiny_checkpoint
from tests.local_verifier.stepping import plain_decode, verify_batched
from tests.local_verifier.test_gguf_tiny import _permute
from tests.local_verifier.test_step_logits import assert_chunks_are_the_step, chunk_steps

Q = GGMLQuantizationType
GGUF_QUANTIZED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0)  # the gguf package quantizes these
TYPES = tuple(QUANT_TYPES)
PROMPT = 300


def random_blocks(rows: int, cols: int, qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    """[rows, bytes per row] of ``qtype`` blocks with random fields and scales that keep the
    values within about +-0.3 (K-quants, which the gguf package does not quantize)."""
    size, values = QUANT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // values, size), dtype=np.uint8)
    top = {Q.Q4_K: 15 * 63, Q.Q5_K: 31 * 63, Q.Q6_K: 32 * 127}[qtype]
    scale = (rng.random((rows, cols // values)) * 0.3 / top).astype(np.float16)
    if qtype == Q.Q6_K:
        blocks[..., 208:210] = scale.view(np.uint8).reshape(rows, -1, 2)
    else:  # d, then dmin
        blocks[..., 0:2] = scale.view(np.uint8).reshape(rows, -1, 2)
        blocks[..., 2:4] = scale.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def write_quant_gguf(
    src: Path,
    dst: Path,
    qtype: GGMLQuantizationType,
    tail: GGMLQuantizationType | None = None,
    llama_order: bool = False,
) -> Path:
    """The tiny checkpoint at ``src`` as a llama GGUF whose linear layers are ``qtype`` (v and
    the MLP's up rows ``tail`` where given, as Q4_K_M files mix Q4_K and Q6_K); its tensors in
    the order of their names, the GGUF ones with ``llama_order`` (as ``llama-quantize`` writes
    them: ``ffn_norm`` between gate and up), else the checkpoint's (gate and up side by side)."""
    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    writer = GGUFWriter(str(dst), "llama")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    vocab = tok["model"]["vocab"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(sorted(vocab, key=vocab.__getitem__))
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    )
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    tensors = sorted(load_file(str(src / "model.safetensors")).items())
    if llama_order:
        tensors.sort(key=lambda item: str(names.get_name(item[0], try_suffixes=(".weight",))))
    for seed, (name, tensor) in enumerate(tensors):
        array = tensor.float().numpy()
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        assert gguf_name is not None, name
        if ".self_attn.q_proj." in name:
            array = _permute(array, cfg["num_attention_heads"])
        elif ".self_attn.k_proj." in name:
            array = _permute(array, cfg["num_key_value_heads"])
        kind = tail if tail is not None and ("v_proj" in name or "up_proj" in name) else qtype
        if array.ndim == 1 or "embed_tokens" in name:
            writer.add_tensor(gguf_name, array.astype(np.float32))
        elif kind in GGUF_QUANTIZED:
            writer.add_tensor(gguf_name, quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(
                gguf_name,
                random_blocks(array.shape[0], array.shape[1], kind, seed),
                raw_dtype=kind,
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def quant_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose every dimension is a whole number of 256-value blocks."""
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny-quant"),
        hidden_size=256,
        intermediate_size=512,
        max_position_embeddings=512,
    )


# every type alone, in llama-quantize's order, then files whose v and up rows are of another
# type (the layers' tails)
FILES = [(t, None) for t in TYPES] + [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q4_0)]
QuantFile = tuple[GGMLQuantizationType, Path, GGMLQuantizationType | None]


@pytest.fixture(
    scope="module", params=FILES, ids=lambda f: "+".join(t.name for t in f if t is not None)
)
def quant_file(
    request: pytest.FixtureRequest, quant_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> QuantFile:
    qtype, tail = request.param
    path = tmp_path_factory.mktemp("quant") / "tiny.gguf"
    return qtype, write_quant_gguf(quant_checkpoint, path, qtype, tail, tail is None), tail


@pytest.fixture(scope="module")
def native(quant_file: QuantFile) -> LoadedModel:
    return load_model(str(quant_file[1]), device="cpu", dtype="native", tune_threads=False)


def _kv(lm: LoadedModel, slots: int) -> KVStorage:
    return KVStorage(lm.config, slots, dtype=lm.model.kv_dtype)


def _prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 176, (n,), generator=torch.Generator().manual_seed(seed))


def _prefill(
    model: Transformer, kv: KVStorage, tokens: torch.Tensor, chunks: list[int]
) -> torch.Tensor:
    """Every row's logits of ``tokens`` fed in steps of ``chunks`` rows (slots = positions)."""
    rows, start = [], 0
    for size in chunks:
        slots = torch.arange(start, start + size)
        step = SeqStep(tokens[start : start + size], slots, slots, torch.arange(start))
        rows.append(model.step([step], kv)[0])
        start += size
    return torch.cat(rows)


def test_linear_layers_hold_the_files_blocks(native: LoadedModel, quant_file: QuantFile) -> None:
    qtype, path, tail = quant_file
    linears = [m for m in native.model.modules() if isinstance(m, Linear)]
    assert len(linears) == 1 + 4 * native.config.n_layers
    mapped = [  # the address ranges of the file's own mappings
        tuple(int(end, 16) for end in line.split()[0].split("-"))
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(path))
    ]
    for module in linears:
        for run in module.runs():
            assert layout_of(run) == "quant"
            assert any(low <= run.data_ptr() < high for low, high in mapped)  # used in place
    for block in native.model.layers:
        layer = cast(Block, block)
        # q, k and v apart (the file holds k, wo, q, v); up apart from gate where the file
        # sets ffn_norm between them (llama's order) or gives it another type
        assert layer.attn.wqkv.first_parts == (0, 1, 2)
        assert layer.attn.qk_pairs  # q and k in the file's pair order
        assert layer.ffn.w13.first_parts == (0, 1)
        q, k, v = layer.attn.wqkv.runs()
        gate, up = layer.ffn.w13.runs()
        other = tail or qtype
        assert [quant_type(w) for w in (q, k, v, gate, up)] == [qtype, qtype, other, qtype, other]
    assert native.model.fused_stack() is not None


def _rotate_half_rows(run: torch.Tensor, heads: int) -> torch.Tensor:
    """A copy of q's or k's rows of blocks (in a GGUF llama file's pair order) in
    rotate-half order."""
    rest = run.shape[1:]
    return run.reshape(heads, -1, 2, *rest).transpose(1, 2).reshape(run.shape).contiguous()


def test_q_and_k_in_the_files_pair_order_give_the_bits_of_their_rows_put_back(
    native: LoadedModel, quant_file: QuantFile
) -> None:
    """q and k used where the file holds them, in its pair order, and each step's values put
    back after the linear: the logits, fused and op by op, of copies of those rows in
    rotate-half order, bitwise."""
    copied = load_model(str(quant_file[1]), device="cpu", dtype="native", tune_threads=False)
    cfg = copied.config
    for block in copied.model.layers:
        attn = cast(Block, block).attn
        q, k, v = attn.wqkv.runs()
        qk = torch.cat([_rotate_half_rows(q, cfg.n_heads), _rotate_half_rows(k, cfg.n_kv_heads)])
        one_type = quant_type(v) == quant_type(q)
        attn.wqkv.weight = nn.Parameter(torch.cat([qk, v]) if one_type else qk, False)
        attn.wqkv.run1 = None if one_type else nn.Parameter(v, False)
        attn.wqkv.run2 = None
        attn.wqkv.first_parts = (0,) if one_type else (0, 2)
        attn.qk_pairs = False
    tokens = _prompt(40, 6)
    for fused in (True, False):
        for lm in (native, copied):
            lm.model.kernel_options = replace(lm.model.kernel_options, fused=fused)
        try:
            assert (native.model.fused_stack() is not None) == fused
            ours = _prefill(native.model, _kv(native, 40), tokens, [3, 37])
            theirs = _prefill(copied.model, _kv(copied, 40), tokens, [3, 37])
            assert torch.equal(ours, theirs), fused
        finally:
            native.model.kernel_options = replace(native.model.kernel_options, fused=True)


def test_rows_are_the_same_alone_chunked_batched_fused_and_on_two_threads(
    native: LoadedModel,
) -> None:
    model = native.model
    tokens = _prompt(PROMPT, 1)
    whole = _prefill(model, _kv(native, PROMPT), tokens, [PROMPT])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            chunked = _prefill(model, _kv(native, PROMPT), tokens, [1, 7, 64, PROMPT - 72])
            assert torch.equal(chunked, whole), count
    finally:
        torch.set_num_threads(threads)
    kv = _kv(native, PROMPT + 64)
    other = _prompt(64, 2)
    slots = torch.arange(PROMPT)
    alone_rows = torch.arange(PROMPT, PROMPT + 64)
    batched, _ = model.step(
        [
            SeqStep(tokens, slots, slots, slots[:0]),
            SeqStep(other, torch.arange(64), alone_rows, alone_rows[:0]),
        ],
        kv,
    )
    assert torch.equal(batched, whole)
    per_op = replace(model.kernel_options, fused=False)
    fused = model.kernel_options
    try:
        model.kernel_options = per_op
        assert torch.equal(_prefill(model, _kv(native, PROMPT), tokens, [7, PROMPT - 7]), whole)
    finally:
        model.kernel_options = fused


def test_chunked_logits_are_the_steps_bits(native: LoadedModel) -> None:
    assert native.model.fused_stack() is not None
    seqs = chunk_steps(native.config.vocab_size)
    assert_chunks_are_the_step(native.model, _kv(native, 64), seqs)


def test_tree_rows_equal_their_paths_decoded_one_row_at_a_time(native: LoadedModel) -> None:
    model, n = native.model, 12
    parents = [-1, 0, 0, 1, 1, 2, -1, 6, 7, 3, 9, 5]
    mask, depth = torch.zeros(n, n, dtype=torch.bool), [0] * n
    for i, p in enumerate(parents):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
            depth[i] = depth[p] + 1
    prompt, tokens = _prompt(20, 3), _prompt(n, 4)
    kv = _kv(native, 80)
    _prefill(model, kv, prompt, [20])
    context = torch.arange(20)
    tree = SeqStep(
        tokens, torch.tensor([20 + d for d in depth]), torch.arange(20, 20 + n), context, mask=mask
    )
    logits = model.step([tree], kv)[0]
    for i in range(n):
        path = mask[i].nonzero().flatten()
        base = 40
        for j, row in enumerate(path.tolist()):  # the path alone, one row per step
            slot = torch.tensor([base + j])
            step = SeqStep(
                tokens[row : row + 1],
                torch.tensor([20 + j]),
                slot,
                torch.cat([context, torch.arange(base, base + j)]),
            )
            last = model.step([step], kv)[0]
        assert torch.equal(logits[i], last[0]), i


def test_native_is_close_to_the_same_weights_dequantized(
    native: LoadedModel, quant_file: QuantFile
) -> None:
    reference = load_model(str(quant_file[1]), device="cpu", dtype="float32", tune_threads=False)
    tokens = _prompt(40, 5)
    ours = _prefill(native.model, _kv(native, 40), tokens, [40])
    theirs = _prefill(reference.model, _kv(reference, 40), tokens, [40])
    spread = theirs.abs().max()
    assert (ours - theirs).abs().max() < 0.08 * spread  # activations quantized to 8 bits
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9


def test_native_loads_a_checkpoint_without_blocks_in_the_default_dtype(
    quant_checkpoint: Path,
) -> None:
    lm = load_model(str(quant_checkpoint), device="cpu", dtype="native", tune_threads=False)
    assert lm.dtype == resolve_dtype(None, torch.device("cpu"))
    assert all(layout_of(p) != "quant" for p in lm.model.parameters())


def test_native_needs_the_cpp_kernels(
    quant_file: QuantFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTGATE_KERNELS", "torch")
    with pytest.raises(ModelLoadError, match="dtype 'native' needs the C\\+\\+ kernels"):
        load_model(str(quant_file[1]), device="cpu", dtype="native", tune_threads=False)


def test_shipped_smollm2_runs_its_q4_1_blocks_and_drafts_equal_plain_decoding() -> None:
    lm = load_model("smollm2-135m", dtype="native", tune_threads=False)
    layers = [m.weight for m in lm.model.layers.modules() if isinstance(m, Linear)]
    assert {quant_type(w) for w in layers} == {Q.Q4_1}
    layer = cast(Block, lm.model.layers[0])
    assert layer.ffn.w13.first_parts == (0,)  # gate and up side by side in the file: one run
    assert quant_type(lm.model.head.weight) == Q.Q8_0  # the tied embedding's blocks ...
    assert lm.model.embed.weight is lm.model.head.weight  # ... the embedding's own
    ids_in = torch.tensor([0, 7, 1234, 49151])
    reader = gguf.GGUFReader(resolve_spec("smollm2-135m")[0])
    (embd,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    want = gguf.quants.dequantize(np.asarray(embd.data)[ids_in.numpy()], embd.tensor_type)
    assert torch.equal(gather_rows(lm.model.embed.weight, ids_in), torch.from_numpy(want))
    assert lm.model.fused_stack() is not None
    ids = lm.tokenizer.encode("def fibonacci(n):\n    ")
    tokens, plain = plain_decode(lm, ids, 12)
    other = lm.tokenizer.encode("import os\n")
    assert torch.equal(verify_batched(lm, ids, tokens, other, split=3), plain)


def test_the_shipped_file_runs_its_blocks_by_default_where_the_cpu_says_so() -> None:
    """No dtype: SmolLM2's Q4_1 blocks on AVX2, AVX-512 and AMX CPUs, the float default
    elsewhere; a dtype named runs that dtype."""
    lm = load_model("smollm2-135m", max_seq_len=256, tune_threads=False)
    layer = cast(Block, lm.model.layers[0])
    assert (layout_of(layer.ffn.w2.weight) == "quant") is blocks_by_default()
    assert (lm.target == "native") is blocks_by_default()
    lm = load_model("smollm2-135m", dtype="float32", max_seq_len=256, tune_threads=False)
    assert all(layout_of(p) != "quant" for p in lm.model.parameters())
    assert lm.target == "float32"


def _before_unreadable_page(blocks: np.ndarray) -> tuple[mmap.mmap, torch.Tensor]:
    """``blocks`` copied into memory that ends where an unreadable page begins (the region,
    which must outlive the tensor, and the tensor)."""
    page, size = mmap.PAGESIZE, blocks.nbytes
    pages = -(-size // page)
    region = mmap.mmap(-1, (pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + pages * page), page, 0) == 0  # PROT_NONE
    view = torch.frombuffer(region, dtype=torch.uint8, count=size, offset=pages * page - size)
    view.copy_(torch.from_numpy(blocks.reshape(-1)))
    return region, view.view(blocks.shape)


def _one_row_kernel(
    library: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """x's rows through the one-row kernel (cpu/quant_gemv.h), one thread."""
    (n, k), m = x.shape, weight.shape[0]
    y, qtype = torch.empty(n, m), int(quant_type(weight))
    ptrs = (x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr())
    assert library.dg_linear_quant_one_row(*ptrs, n, k, m, qtype, 1) == 0
    return y


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_the_linear_kernel_gives_each_row_the_one_row_kernels_bits_at_every_row_count(
    qtype: GGMLQuantizationType,
) -> None:
    """1-70 rows through the step's kernel (tiles of columns, passes of rows; the one-row
    kernel itself for one row of most types on AVX2) on one thread or two against each row
    through the one-row kernel: 53 outputs (a partial tile) with a bias, the weight's last
    block just before an unreadable page (a read past the weight would crash the process)."""
    library, why = load_library()
    if library is None:
        pytest.skip(f"no C++ kernels here: {why}")
    ops, (m, k), (size, values) = CppOps(library), (53, 512), QUANT_TYPES[qtype]
    rng = np.random.default_rng(int(qtype))
    if qtype in GGUF_QUANTIZED:
        blocks = quantize((rng.standard_normal((m, k)) * 0.1).astype(np.float32), qtype)
    else:
        blocks = random_blocks(m, k, qtype, int(qtype))
    region, weight = _before_unreadable_page(blocks.reshape(m, k // values, size))
    x = torch.from_numpy(rng.standard_normal((70, k)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(m).astype(np.float32))
    alone = _one_row_kernel(library, x, weight, bias)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 70):
                assert torch.equal(ops.linear(x[:rows], weight, bias), alone[:rows]), (count, rows)
            assert torch.equal(ops.linear(x[69:], weight, bias), alone[69:])
    finally:
        torch.set_num_threads(threads)
    exact = x.double() @ dequantized(weight).double().T + bias.double()
    assert (alone.double() - exact).abs().max() < 0.02 * exact.abs().max()
    del weight
    region.close()


def _patched(path: Path, tensor: str, dst: Path, dims: int = 2, **fields: int) -> Path:
    """``path`` with tensor ``tensor``'s index entry changed: ``ne0`` (its row length),
    ``ne1`` (its row count) or ``type`` (its GGML type code)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name) + 4
    if "ne0" in fields:
        data[at : at + 8] = fields["ne0"].to_bytes(8, "little")
    if "ne1" in fields:
        data[at + 8 : at + 16] = fields["ne1"].to_bytes(8, "little")
    if "type" in fields:
        at += 8 * dims
        data[at : at + 4] = fields["type"].to_bytes(4, "little")
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": 99}, "tensor blk.1.ffn_down.weight has unknown GGML type 99"),
        ({"ne0": 500}, r"tensor blk.1.ffn_down.weight of type Q8_0 has shape \[500, 256\]"),
        (
            {"ne0": 256, "ne1": 512},
            r"down_proj.weight: .*\(512, 256\)|checkpoint shape \(512, 256\)",
        ),
    ],
)
def test_a_tensor_of_unknown_type_partial_blocks_or_another_shape_is_a_load_error(
    quant_checkpoint: Path, tmp_path: Path, fields: dict[str, int], message: str
) -> None:
    good = write_quant_gguf(quant_checkpoint, tmp_path / "good.gguf", Q.Q8_0)
    bad = _patched(good, "blk.1.ffn_down.weight", tmp_path / "bad.gguf", **fields)
    for dtype in ("native", "float32"):
        with pytest.raises(ModelLoadError, match=message):
            load_model(str(bad), device="cpu", dtype=dtype, tune_threads=False)


@pytest.mark.parametrize("keep", [0.97, 0.6])
def test_a_truncated_quantized_file_is_a_load_error_naming_its_tensor(
    quant_checkpoint: Path, tmp_path: Path, keep: float
) -> None:
    good = write_quant_gguf(quant_checkpoint, tmp_path / "good.gguf", Q.Q4_1)
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    for dtype in ("native", "float32"):
        with pytest.raises(
            ModelLoadError, match=r"cut\.gguf: the GGUF file is truncated \(tensor [\w.]+\)"
        ):
            load_model(str(cut), device="cpu", dtype=dtype, tune_threads=False)
