"""draftgate's drafts inside vLLM: a plugin whose proposals join vLLM's own speculation.

:mod:`draftgate_vllm.drafts` is the drafting (plain Python, no vLLM);
:mod:`draftgate_vllm.plugin` hooks it into vLLM's model runner.
"""
