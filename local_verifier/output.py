"""Turns committed tokens into streamed text, ending exactly where plain decoding would."""

from __future__ import annotations

import time
from dataclasses import dataclass

from local_verifier.logprobs import TokenLogprob
from local_verifier.stopping import StopChecker
from local_verifier.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class TextDelta:
    """New output text and the token ids committed with it (text may lag ids at a stop prefix)."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asks


class OutputAssembler:
    """Consumes tokens one at a time: EOS, a stop string or ``max_new`` tokens end the output.

    Tokens after the end (the rest of an accepted draft run) are dropped, so a step that
    commits many tokens at once ends the output at the same token as one-at-a-time decoding.
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str], max_new: int) -> None:
        self.eos_ids = tokenizer.eos_ids
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stopper = StopChecker(stop)
        self.max_new = max_new
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.seconds_per_token = 0.0  # the last push's host time (detokenizing, stops) per token

    def push(self, tokens: list[int]) -> TextDelta:
        """The delta for ``tokens`` (those up to the end of the output)."""
        began = time.perf_counter()
        text: list[str] = []
        taken: list[int] = []
        for token in tokens:
            if self.finish_reason is not None:
                break
            if token in self.eos_ids:
                self.finish_reason = "stop"
                break
            taken.append(token)
            self.token_ids.append(token)
            emit, stopped = self.stopper.push(self.detok.push([token]))
            text.append(emit)
            if stopped:
                self.finish_reason = "stop"
            elif len(self.token_ids) >= self.max_new:
                self.finish_reason = "length"
        if taken:
            self.seconds_per_token = (time.perf_counter() - began) / len(taken)
        return TextDelta("".join(text), taken)

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output (None when another end did)."""
        return self.stopper.matched if self.finish_reason == "stop" else None

    def finish(self) -> TextDelta:
        """Text held back until the end (an incomplete character, a possible stop prefix)."""
        if self.finish_reason is None:
            self.finish_reason = "length"
        emit, stopped = self.stopper.push(self.detok.flush())
        return TextDelta(emit if stopped else emit + self.stopper.flush(), [])
