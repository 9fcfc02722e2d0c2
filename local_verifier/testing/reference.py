"""The reference implementation on the same checkpoint: transformers' own model, for parity
tests and side-by-side benchmarks. Needs ``transformers`` (the ``dev`` extra)."""

from __future__ import annotations

from typing import Any

import torch

from local_verifier.loader import resolve_spec


def load_reference(
    spec: str,
    weight_dtype: torch.dtype = torch.float32,
    round_linear_inputs: bool = False,
    round_queries: bool = False,
) -> Any:
    """transformers' fp32 model for ``spec`` (a path or alias); a GGUF file is read and
    dequantized by transformers itself, so its layout and numerics are the reference's.

    With ``weight_dtype=torch.bfloat16`` every weight is rounded to bf16 and so is every
    K/V value attention reads (the rotated keys and the values; computing in fp32 still):
    what the bf16 target computes on a CPU without bf16 kernels. With
    ``round_linear_inputs`` too, every linear layer's input is rounded to bf16 first: what
    it computes on the bf16 kernels (AMX or AVX512-BF16: ``kernels.packing``). With
    ``round_queries``, attention's queries are rounded to bf16 too: the scores over bf16 K/V
    on a CPU with AVX512-BF16 (bf16 dot products, whatever the linear layers run on)."""
    model = _fp32_model(spec)
    if weight_dtype != torch.float32:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(weight_dtype))
        model.set_attn_implementation(_rounded_kv_attention(weight_dtype, round_queries))
    if round_linear_inputs:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(_bf16_rounded_input)
    return model


def _rounded_kv_attention(dtype: torch.dtype, round_queries: bool) -> str:
    """The name of transformers' sdpa attention on K/V rounded to ``dtype``, and on queries
    rounded to bf16 with ``round_queries`` (registered)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        rounded_key, rounded_value = key.to(dtype).to(key.dtype), value.to(dtype).to(value.dtype)
        if round_queries:
            query = query.to(torch.bfloat16).to(query.dtype)
        return sdpa_attention_forward(module, query, rounded_key, rounded_value, *args, **kwargs)

    name = f"draftgate_kv_{str(dtype).removeprefix('torch.')}{'_q_bf16' if round_queries else ''}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _bf16_rounded_input(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].to(torch.bfloat16).float(), *args[1:])


def _fp32_model(spec: str) -> Any:
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as err:
        raise ImportError(
            "the reference model needs transformers: pip install -e '.[dev]'"
        ) from err

    path, _ = resolve_spec(spec)
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    # non-persistent buffers (rotary inv_freq) are not in the checkpoint: rebuild them on CPU
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.eval()
