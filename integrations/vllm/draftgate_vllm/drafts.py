"""The drafts a gateway attaches to one request, and the proposal made from them each step.

A request's ``SamplingParams.extra_args`` (the OpenAI body's ``vllm_xargs``) may carry
:data:`PREDICTION_KEY`, the predicted answer's token ids, and :data:`DOCUMENTS_KEY`, the
token ids of documents and earlier answers, each ended by :data:`SEPARATOR`. A
:class:`~draftgate_vllm.tracks.Track` follows each, and an
:class:`~draftgate_vllm.tracks.AnswerTrack` the answer itself. :meth:`RequestDrafts.propose`
returns the best backed track's next tokens: the prediction while it is aligned with the
answer's start (all ``k``), else the longest match (:data:`LENGTH_PER_MATCH` tokens per
token matched); :func:`merged` puts them in place of vLLM's own proposal. Whatever is
proposed, vLLM's rejection sampler keeps only what its own decoding would have produced:
drafts change speed, never the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftgate_vllm.tracks import MIN_MATCH, SEPARATOR, AnswerTrack, Track

__all__ = [
    "DOCUMENTS_KEY",
    "MAX_MATCH",
    "MIN_MATCH",
    "PREDICTION_KEY",
    "SEPARATOR",
    "BatchDrafts",
    "Proposal",
    "RequestDrafts",
    "merged",
]

PREDICTION_KEY = "draftgate_prediction"
DOCUMENTS_KEY = "draftgate_documents"
MAX_MATCH = 64
"""Context tokens compared when anchoring (the longest match counted)."""
LENGTH_PER_MATCH = 2
"""Tokens a place away from the answer's start proposes per answer token matched there."""


@dataclass(frozen=True)
class Proposal:
    """A track's draft and how well the answer's recent tokens back it."""

    tokens: list[int]
    matched: int
    aligned: bool
    ends: bool = False
    """The draft stops where its track ends (the prediction's or a document's end)."""

    @property
    def backed(self) -> bool:
        """Whether this proposal should replace the engine's own: the prediction still
        aligned with the answer, or a place at least :data:`MIN_MATCH` tokens long."""
        return bool(self.tokens) and (self.aligned or self.matched >= MIN_MATCH)


class RequestDrafts:
    """The gateway's drafts for one request, and the answer so far."""

    def __init__(self, prediction: Sequence[int] = (), documents: Sequence[int] = ()) -> None:
        self.tracks: list[Track] = []
        if prediction:
            self.tracks.append(Track(list(prediction), 0))
        if documents:
            self.tracks.append(Track(list(documents)))
        self.answer: list[int] = []
        """The answer's tokens followed so far."""
        self.tracks.append(AnswerTrack(self.answer))

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> RequestDrafts | None:
        """The drafts a request's ``extra_args`` carry (None: none, or not token ids)."""
        if not extra_args:
            return None
        prediction = _token_ids(extra_args.get(PREDICTION_KEY), separators=False)
        documents = _token_ids(extra_args.get(DOCUMENTS_KEY), separators=True)
        if prediction is None or documents is None or not (prediction or documents):
            return None
        return cls(prediction, documents)

    @property
    def seen(self) -> int:
        """Answer tokens already followed."""
        return len(self.answer)

    def propose(self, new_tokens: Sequence[int], tail: Sequence[int], k: int) -> Proposal:
        """Follow the answer's ``new_tokens`` (those since the last call), re-anchor lost
        tracks on the context's last tokens ``tail``, and propose up to ``k`` tokens."""
        for token in new_tokens:
            for track in self.tracks:
                track.follow(token, len(self.answer))
            self.answer.append(token)
        best = Proposal([], 0, False)
        for track in self.tracks:
            if track.position is None:
                track.anchor(tail, self.answer)
            length = _length(track, k)
            tokens = track.draft(length)
            proposal = Proposal(tokens, track.matched, track.aligned, len(tokens) < length)
            if proposal.backed and _better(proposal, best):
                best = proposal
        return best


def _length(track: Track, k: int) -> int:
    """How many tokens a track proposes: all ``k`` while the prediction is aligned; else
    :data:`LENGTH_PER_MATCH` per token the answer has matched in a row there, so a place
    found on a short match costs a short verify and a long run earns the whole ``k``."""
    return k if track.aligned else min(k, LENGTH_PER_MATCH * track.matched)


def _better(a: Proposal, b: Proposal) -> bool:
    if not b.backed:
        return True
    return (a.aligned, a.matched) > (b.aligned, b.matched)


def merged(own: list[int], gateway: Proposal) -> list[int]:
    """The draft vLLM verifies: the gateway's when it is backed (vLLM's own where that
    starts with the gateway's and goes further, unless the gateway's track ends there),
    else vLLM's own."""
    if not gateway.backed:
        return own
    ours = gateway.tokens
    if gateway.ends:
        return ours
    return own if len(own) > len(ours) and own[: len(ours)] == ours else ours


def _token_ids(value: Any, *, separators: bool) -> list[int] | None:
    """``value`` as token ids ([] when absent; None when it is not a list of them)."""
    if value is None:
        return []
    if not isinstance(value, list):
        return None
    low = SEPARATOR if separators else 0
    if not all(type(v) is int and v >= low for v in value):
        return None
    return value


class BatchDrafts:
    """The gateway drafts of the requests vLLM is running, by request id."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestDrafts | None] = {}

    def for_request(
        self, req_id: str, extra_args: Mapping[str, Any] | None
    ) -> RequestDrafts | None:
        """The request's drafts, parsed when it is first seen."""
        if req_id not in self.requests:
            self.requests[req_id] = RequestDrafts.from_extra_args(extra_args)
        return self.requests[req_id]

    def keep_only(self, live: Sequence[str]) -> None:
        """Forget requests that left the batch (a resumed one is parsed again)."""
        for req_id in self.requests.keys() - set(live):
            del self.requests[req_id]
