"""Mistral (``MistralForCausalLM``): the Llama layer, every layer on ``sliding_window`` (read
by the common fields)."""

from __future__ import annotations

from local_verifier.families.base import Family

FAMILY = Family(name="mistral", hf_architectures=("MistralForCausalLM",))
