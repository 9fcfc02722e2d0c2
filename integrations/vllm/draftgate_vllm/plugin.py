"""The vLLM side: gateway drafts joined to vLLM's own ``ngram`` or ``suffix`` proposals.

vLLM loads :func:`register` (entry point group ``vllm.general_plugins``) in every process
it starts: the API server, the engine core and its workers. It wraps the V1 model
runner's ``propose_draft_token_ids``: after vLLM's own proposer has run, each request
whose ``extra_args`` carry gateway drafts (:mod:`draftgate_vllm.drafts`) gets the
gateway's proposal in place of vLLM's own where it is backed better; vLLM then verifies
it in its own step with its rejection sampler, so the answer stays vLLM's own. Requests
without gateway drafts keep vLLM's proposal untouched.

The hook relies on vLLM internals; :func:`register` checks them (the version, the method's
parameters, the V1 runner) and raises at start-up when they differ, rather than serving
without the drafts.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import Any

from draftgate_vllm.drafts import MAX_MATCH, BatchDrafts, merged

log = logging.getLogger("vllm.draftgate_vllm")  # under vLLM's logger: in the server's log

SUPPORTED_VERSIONS = ("0.32.0",)
METHODS = ("ngram", "suffix")
"""vLLM's speculative methods whose proposals the gateway's drafts join."""
_PARAMETERS = ("self", "scheduler_output", "sampled_token_ids")
_WRAPPED = "_draftgate_wrapped"


class PluginError(RuntimeError):
    """vLLM is not what this plugin was written against."""


def register() -> None:
    """vLLM's plugin entry point (called once per process, possibly more): check vLLM and
    wrap its model runner's proposal step."""
    import vllm
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if vllm.__version__ not in SUPPORTED_VERSIONS:
        raise PluginError(
            f"draftgate_vllm supports vLLM {', '.join(SUPPORTED_VERSIONS)}, not {vllm.__version__}"
        )
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() in ("1", "true"):
        raise PluginError(
            "draftgate_vllm hooks the V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER"
        )
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # inherited by the engine core
    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, _WRAPPED, False):
        return
    parameters = tuple(inspect.signature(original).parameters)
    if parameters[: len(_PARAMETERS)] != _PARAMETERS:
        raise PluginError(f"unexpected propose_draft_token_ids{parameters}")
    GPUModelRunner.propose_draft_token_ids = _wrap(original)


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def propose_draft_token_ids(
        self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        drafts = original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        if self.speculative_config.method not in METHODS:
            return drafts
        if not hasattr(self, "_draftgate_drafts"):
            self._draftgate_drafts = BatchDrafts()
            log.info(
                "draftgate_vllm: gateway drafts join vLLM's %s proposals (k=%d)",
                self.speculative_config.method,
                self.speculative_config.num_speculative_tokens,
            )
        k = scheduler_output.num_spec_tokens_to_schedule
        return join_batch(self, self._draftgate_drafts, drafts, sampled_token_ids, k)

    setattr(propose_draft_token_ids, _WRAPPED, True)
    return propose_draft_token_ids


def join_batch(
    runner: Any, batch_drafts: BatchDrafts, own: list[list[int]], sampled: list[list[int]], k: int
) -> list[list[int]]:
    """vLLM's proposals ``own`` (one list per request of the runner's input batch) with
    each request's gateway drafts joined in; a request with drafts proposes no further
    than its ``max_tokens`` can take (tokens accepted past it would be verified for
    nothing)."""
    batch = runner.input_batch
    req_ids = batch.req_ids
    max_model_len = runner.max_model_len
    for i, req_id in enumerate(req_ids[: len(own)]):
        if not sampled[i]:  # a partial prefill: vLLM proposes nothing either
            continue
        state = runner.requests.get(req_id)
        params = state.sampling_params if state is not None else None
        drafts = batch_drafts.for_request(req_id, params.extra_args if params else None)
        if drafts is None:
            continue
        num_tokens = int(batch.num_tokens_no_spec[i])
        num_prompt = int(batch.num_prompt_tokens[i])
        room = min(k, max_model_len - num_tokens - 1, _left(params, num_tokens - num_prompt))
        if room <= 0:  # this step's token is the answer's last
            own[i] = []
            continue
        row = batch.token_ids_cpu[i]
        new_tokens = row[num_prompt + drafts.seen : num_tokens].tolist()
        tail = row[max(0, num_tokens - MAX_MATCH) : num_tokens].tolist()
        own[i] = merged(own[i][:room], drafts.propose(new_tokens, tail, room))
    batch_drafts.keep_only(req_ids)
    return own


def _left(params: Any, outputs: int) -> int:
    """Draft tokens a request's ``max_tokens`` leaves room for after ``outputs`` tokens
    (the step adds one token of its own past the accepted drafts)."""
    max_tokens = getattr(params, "max_tokens", None)
    return max_tokens - outputs - 1 if isinstance(max_tokens, int) else 1 << 30
