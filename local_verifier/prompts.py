"""A submitted request's prompt and prediction as token ids, checked before it is queued."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from local_verifier.errors import PredictionTooLong
from local_verifier.request import GenerationRequest
from local_verifier.tokenizer import Tokenizer


class PromptEncoder:
    """Tokenises requests for one model: ids within its vocabulary, lengths within its context."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_length = context_length

    def tokenised(self, req: GenerationRequest) -> GenerationRequest:
        """``req`` with its prompt and prediction as token ids, each checked against the
        model's embedding and the context (tokenised once for all ``n`` answers)."""
        prompt_ids = self._prompt_ids(req)
        prediction = req.prediction_ids
        if prediction is None and req.prediction:
            # a token is at most max_token_bytes long: a longer text cannot fit the context
            if len(req.prediction.encode()) > self.context_length * self._max_token_bytes:
                raise PredictionTooLong(self.context_length)
            prediction = self.tokenizer.encode(req.prediction, add_special_tokens=False)
        if prediction is not None:
            if len(prediction) > self.context_length:
                raise PredictionTooLong(self.context_length)
            self._check_ids("prediction", prediction)
        return dataclasses.replace(
            req, messages=None, prompt=None, prompt_ids=prompt_ids, prediction_ids=prediction
        )

    @functools.cached_property
    def _max_token_bytes(self) -> int:
        """The longest token's UTF-8 bytes (bounds a text's token count from below)."""
        tokens = self.tokenizer.backend.get_vocab()
        return max(len(t.encode()) for t in tokens) if tokens else 1

    def _check_ids(self, what: str, ids: Sequence[int]) -> None:
        """A ``ValueError`` for a token id the model's embedding has no row for."""
        vocab = self.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(
                f"{what}: token id {bad} is outside this model's vocabulary [0, {vocab})"
            )

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
        if not ids:
            raise ValueError("the prompt is empty")
        self._check_ids("prompt", ids)
        return ids
