"""Llama 2/3 and SmolLM (``LlamaForCausalLM``): the decoder's base layer, and the tensor names
every loader presents to it (Hugging Face's Llama names)."""

from __future__ import annotations

from local_verifier.families.base import Family

FAMILY = Family(name="llama", hf_architectures=("LlamaForCausalLM",))

TOP_TENSORS: dict[str, list[str]] = {
    "embed.weight": ["model.embed_tokens.weight"],
    "norm.weight": ["model.norm.weight"],
    "head.weight": ["lm_head.weight"],  # unread where the head is the embedding
}
"""The decoder's top-level parameters -> the tensors they are read from."""

LAYER_TENSORS: dict[str, list[str]] = {
    "attn_norm.weight": ["input_layernorm.weight"],
    "ffn_norm.weight": ["post_attention_layernorm.weight"],
    "attn.q_norm.weight": ["self_attn.q_norm.weight"],
    "attn.k_norm.weight": ["self_attn.k_norm.weight"],
    "attn.wqkv.weight": [f"self_attn.{n}_proj.weight" for n in "qkv"],
    "attn.wqkv.bias": [f"self_attn.{n}_proj.bias" for n in "qkv"],
    "attn.wo.weight": ["self_attn.o_proj.weight"],
    "ffn.w13.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    "ffn.w2.weight": ["mlp.down_proj.weight"],
}
"""A layer's parameters (under ``layers.{i}.``) -> the tensors they are read from, in row
order (under ``model.layers.{i}.``); a fused matrix reads several."""
