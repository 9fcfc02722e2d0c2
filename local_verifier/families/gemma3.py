"""Gemma 3 (``Gemma3ForCausalLM``, GGUF ``gemma3``): q/k RMSNorms, norms after attention and MLP, GeGLU, a
scaled embedding, and every sixth layer global, the others on a sliding window with their own
rope base. Also what its checkpoints leave implicit: the layer pattern, the local rope base,
the chat template (as Google publishes it with the instruction-tuned models) and the
(1 + w) norms."""

from __future__ import annotations

from typing import Any

from local_verifier.errors import ModelLoadError
from local_verifier.families import llama
from local_verifier.families.base import Family, GGUFMetadata

SLIDING_PATTERN = 6  # every sixth layer attends globally, the others to a sliding window
LOCAL_ROPE_THETA = 10000.0
END_OF_TURN = "<end_of_turn>"

CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""


def layer_types(n_layers: int, pattern: int = SLIDING_PATTERN) -> tuple[str, ...]:
    """Each layer's attention: every ``pattern``-th layer full, the others sliding."""
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
    )


LAYER_TENSORS: dict[str, list[str]] = {
    **llama.LAYER_TENSORS,
    "ffn_norm.weight": ["pre_feedforward_layernorm.weight"],
    "post_attn_norm.weight": ["post_attention_layernorm.weight"],
    "post_ffn_norm.weight": ["post_feedforward_layernorm.weight"],
}
"""Llama's layer tensors, with the norms around attention and MLP as Gemma names them (the
post-attention norm is not the pre-MLP one)."""

GGUF_TENSORS: dict[str, str] = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
"""The norms around attention and MLP as llama.cpp names them in a GGUF file."""

LAYER: dict[str, Any] = dict(qk_norm=True, post_norms=True, activation="gelu_tanh")
"""The switches of Gemma's layer, whatever the checkpoint's format."""


def config(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's layer differences; ``ModelLoadError`` for the settings the decoder lacks."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if raw.get(key) is not None:
            raise ModelLoadError(f"unsupported Gemma setting {key}={raw[key]}")
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    if raw.get("query_pre_attn_scalar", head_dim) != head_dim:
        raise ModelLoadError("unsupported Gemma query_pre_attn_scalar other than head_dim")
    params = raw.get("rope_parameters") or {}
    local = params.get("sliding_attention", {}).get("rope_theta")
    fields: dict[str, Any] = dict(
        **LAYER,
        embed_scale=raw["hidden_size"] ** 0.5,
        rope_local_theta=float(local or raw.get("rope_local_base_freq") or LOCAL_ROPE_THETA),
    )
    if raw.get("sliding_window") is not None and raw.get("layer_types") is None:
        fields.update(layer_types=layer_types(raw["num_hidden_layers"]))
    return fields


def gguf_config(meta: GGUFMetadata, common: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's layer differences from a GGUF file, whose norms llama.cpp's converter stored
    as the (1 + w) they apply."""
    pattern = meta("attention.sliding_window_pattern")
    pattern = SLIDING_PATTERN if pattern is None else pattern
    types = (
        tuple("sliding_attention" if s else "full_attention" for s in pattern)
        if isinstance(pattern, list)
        else layer_types(common["n_layers"], int(pattern))
    )
    local_theta = meta("rope.freq_base_swa")
    return dict(
        **LAYER,
        embed_scale=common["dim"] ** 0.5,
        layer_types=types if common.get("sliding_window") else None,
        rope_local_theta=float(LOCAL_ROPE_THETA if local_theta is None else local_theta),
    )


FAMILY = Family(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM",),
    hf_config=config,
    tie_embeddings=True,
    offset_norms=True,
    gguf_architectures=("gemma3",),
    gguf_config=gguf_config,
    gguf_tensors=GGUF_TENSORS,
    vocab_by_place=True,
    end_of_turn=END_OF_TURN,
    chat_template=CHAT_TEMPLATE,
)
