"""Llama 2/3 and SmolLM (``LlamaForCausalLM``, GGUF ``llama``): the decoder's base layer, the
tensor names every loader presents to it (Hugging Face's Llama names) and llama.cpp's names
for them."""

from __future__ import annotations

from local_verifier.families.base import Family

FAMILY = Family(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    gguf_architectures=("llama",),
    gguf_interleaved_qk=True,
)

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

GGUF_TOP_TENSORS: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
"""A GGUF file's top-level tensors -> the names the decoder reads them by."""

GGUF_LAYER_TENSORS: dict[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
"""A layer's GGUF tensors (under ``blk.{i}.``) -> the names the decoder reads them by (under
``model.layers.{i}.``)."""
