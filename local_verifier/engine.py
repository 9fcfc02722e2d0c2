"""The generation engine the gateway runs: one loaded model, speculative decoding per request."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from local_verifier.costs import measure_step_costs
from local_verifier.errors import PromptTooLong
from local_verifier.kv_cache import KVCache
from local_verifier.loader import LoadedModel, load_model
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.sampling import SamplingParams, make_generator, sample, target_probs
from local_verifier.speculate import DraftPolicy, DraftSource, LoopStats, speculative_decode
from lookup.controller import DraftController
from lookup.draft import Source
from lookup.drafter import Drafter
from lookup.index import IndexCache

__all__ = ["DocumentTokens", "Engine", "GenerationRequest", "GenerationStats", "TextDelta"]

DocumentTokens = tuple[str, np.ndarray]  # (content sha256, uint32 token ids)
MAX_DRAFT = 64  # largest draft whose verify cost is measured (and so may be chosen)


@dataclass
class GenerationRequest:
    """One generation: chat ``messages``, a raw ``prompt`` or ``prompt_ids`` (exactly one)."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None = up to the context
    stop: list[str] = field(default_factory=list)
    prediction: str | None = None
    documents: list[DocumentTokens] = field(default_factory=list)
    document_sources: list[Source] = field(default_factory=list)  # default: Source.DOCUMENT
    draft: bool = True
    max_draft: int | None = None  # cap on draft tokens per verify step (None = measured range)


@dataclass(frozen=True)
class GenerationStats:
    """Per-request counters; the last item ``Engine.generate`` yields."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    verify_steps: int
    drafted_tokens: int
    accepted_tokens: int
    accepted_by_position: list[int]
    accepted_by_source: dict[str, int]  # accepted draft tokens per source (Source names)
    accepted_prediction_tokens: int | None
    rejected_prediction_tokens: int | None
    prefill_s: float
    draft_s: float
    verify_s: float
    total_s: float


class Engine:
    """Loads a model once and runs requests one at a time (not thread-safe)."""

    def __init__(
        self,
        model: str | LoadedModel = "smollm2-135m",
        device: str | None = None,
        dtype: str | None = None,
        max_draft: int = MAX_DRAFT,
    ) -> None:
        self.lm = model if isinstance(model, LoadedModel) else load_model(model, device, dtype)
        self.tokenizer = self.lm.tokenizer
        self.name = self.lm.name
        self.context_length = self.lm.config.max_seq_len
        self.step_costs = measure_step_costs(self.lm, min(max_draft, self.context_length - 1))
        self.index_cache = IndexCache()
        model_ = self.lm.model
        self._cache = KVCache(
            self.lm.config, self.context_length, device=model_.device, dtype=model_.dtype
        )

    def generate(
        self,
        req: GenerationRequest,
        *,
        drafter: DraftSource | None = None,
        controller: DraftPolicy | None = None,
    ) -> Iterator[TextDelta | GenerationStats]:
        """Stream ``TextDelta``s, then one ``GenerationStats``.

        Raises ``PromptTooLong`` or ``ValueError`` here, before anything is yielded.
        ``drafter``/``controller`` replace the request's own lookup drafter and cost-based
        controller (tests inject fixed drafts this way).
        """
        prompt_ids = self._prompt_ids(req)
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise PromptTooLong(len(prompt_ids), self.context_length)
        if req.max_tokens is not None and req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        max_new = room if req.max_tokens is None else min(req.max_tokens, room)
        if req.draft and drafter is None:
            drafter = self._drafter(req, prompt_ids)
        if req.draft and controller is None:
            costs = self.step_costs
            if req.max_draft is not None:
                costs = costs[: req.max_draft + 1]
            controller = DraftController(costs)
        if not req.draft:
            drafter = controller = None
        return self._run(req, prompt_ids, max_new, drafter, controller)

    def memory(self) -> dict[str, int]:
        """Bytes: model weights, KV cache reserved and in use, document indexes."""
        weights = sum(p.numel() * p.element_size() for p in self.lm.model.parameters())
        reserved = self._cache.nbytes()
        return {
            "weights_bytes": int(weights),
            "kv_reserved_bytes": int(reserved),
            "kv_in_use_bytes": int(reserved * self._cache.length // self._cache.max_len),
            "index_bytes": int(self.index_cache.nbytes()),
        }

    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        given = [x is not None for x in (req.messages, req.prompt, req.prompt_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of messages, prompt or prompt_ids")
        if req.messages is not None:
            text = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        elif req.prompt is not None:
            ids = self.tokenizer.encode(req.prompt, add_special_tokens=True)
        else:
            ids = [int(t) for t in req.prompt_ids or []]
            vocab = self.lm.config.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt_ids must be in [0, {vocab})")
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _drafter(self, req: GenerationRequest, prompt_ids: Sequence[int]) -> Drafter:
        prediction = (
            self.tokenizer.encode(req.prediction, add_special_tokens=False)
            if req.prediction
            else None
        )
        documents = [self.index_cache.get_or_build(key, tokens) for key, tokens in req.documents]
        return Drafter(
            prompt_ids,
            prediction=prediction,
            documents=documents,
            document_sources=req.document_sources,
        )

    def _run(
        self,
        req: GenerationRequest,
        prompt_ids: list[int],
        max_new: int,
        drafter: DraftSource | None,
        controller: DraftPolicy | None,
    ) -> Iterator[TextDelta | GenerationStats]:
        began = time.perf_counter()
        model = self.lm.model
        params = req.params
        generator = None if params.greedy else make_generator(params.seed, model.device)
        cache = self._cache
        cache.reset()
        tokens = torch.tensor(prompt_ids, dtype=torch.long, device=model.device)
        logits = model(tokens, cache, last_only=True)[-1]
        if params.greedy:
            first = int(logits.argmax())
        else:
            first = sample(target_probs(logits, params), generator)  # type: ignore[arg-type]
        prefill_s = time.perf_counter() - began
        loop = LoopStats()
        out = OutputAssembler(self.tokenizer, req.stop, max_new)
        steps = speculative_decode(
            model, cache, first, max_new, params, generator, drafter, controller, loop
        )
        for new in steps:
            delta = out.push(new)
            if delta.token_ids or delta.text:
                yield delta
            if out.finish_reason is not None:
                break
        steps.close()
        tail = out.finish()
        if tail.text:
            yield tail
        usage = getattr(drafter, "prediction_usage", None)
        accepted_pred, rejected_pred = (
            usage() if usage is not None and req.prediction else (None, None)
        )
        yield GenerationStats(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(out.token_ids),
            finish_reason=out.finish_reason or "length",
            verify_steps=loop.verify_steps,
            drafted_tokens=loop.drafted_tokens,
            accepted_tokens=loop.accepted_tokens,
            accepted_by_position=loop.accepted_by_position,
            accepted_by_source=loop.accepted_by_source,
            accepted_prediction_tokens=accepted_pred,
            rejected_prediction_tokens=rejected_pred,
            prefill_s=prefill_s,
            draft_s=loop.draft_s,
            verify_s=loop.verify_s,
            total_s=time.perf_counter() - began,
        )
