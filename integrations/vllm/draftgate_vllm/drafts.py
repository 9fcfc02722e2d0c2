"""The drafts a gateway attaches to one request, followed as the answer grows.

A request's ``SamplingParams.extra_args`` (the OpenAI body's ``vllm_xargs``) may carry
:data:`PREDICTION_KEY`, the predicted answer's token ids, and :data:`DOCUMENTS_KEY`, the
token ids of documents and earlier answers, each ended by :data:`SEPARATOR`. A
:class:`Track` follows each: the prediction starts aligned with the first token of the
answer (as the Predicted Outputs APIs align it); the documents, and the prediction once
the answer leaves it, are anchored where the answer's last tokens occur longest (at
least :data:`MIN_MATCH` of them). :meth:`RequestDrafts.propose` returns the chosen
track's next tokens, and :func:`merged` puts them in place of vLLM's own proposal when
they are backed better. Whatever is proposed, vLLM's rejection sampler keeps only what
its own decoding would have produced: drafts change speed, never the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PREDICTION_KEY = "draftgate_prediction"
DOCUMENTS_KEY = "draftgate_documents"
SEPARATOR = -1
"""Ends each document in :data:`DOCUMENTS_KEY`; never a token, so no match crosses it."""
MIN_MATCH = 3
"""Context tokens a track must match where it is anchored (the index's n-gram)."""
MAX_MATCH = 64
"""Context tokens compared when anchoring (the longest match counted)."""
LENGTH_PER_MATCH = 2
"""Tokens a place away from the answer's start proposes per answer token matched there."""
MAX_CANDIDATES = 64
"""Occurrences of the last :data:`MIN_MATCH` tokens compared when anchoring."""


class Track:
    """One token sequence drafts are copied from, and where the answer stands in it."""

    def __init__(self, tokens: list[int], position: int | None = None) -> None:
        self.tokens = tokens
        self.position = position
        """The index of the token expected next (None: the answer is not in this track)."""
        self.matched = 0
        """Answer tokens this track has matched in a row up to ``position``."""
        self.aligned = position is not None
        """Still aligned with the answer's start (a prediction never left)."""
        self._index: dict[tuple[int, ...], list[int]] | None = None

    def follow(self, token: int) -> None:
        """Take the answer's next token: the track moves on, or loses its place."""
        at = self.position
        if at is not None and at < len(self.tokens) and self.tokens[at] == token:
            self.position = at + 1
            self.matched += 1
        else:
            self.position = None
            self.matched = 0
            self.aligned = False

    def anchor(self, tail: Sequence[int]) -> None:
        """Place the track after the longest occurrence of the context's last tokens
        ``tail`` (the first occurrence among equals); unplaced below :data:`MIN_MATCH`."""
        if len(tail) < MIN_MATCH:
            return
        tokens = self.tokens
        best, best_len = None, 0
        for end in self._occurrences().get(tuple(tail[-MIN_MATCH:]), ())[:MAX_CANDIDATES]:
            n = MIN_MATCH
            while n < len(tail) and n < end and tokens[end - n - 1] == tail[-n - 1]:
                n += 1
            if n > best_len and end < len(tokens) and tokens[end] != SEPARATOR:
                best, best_len = end, n
        if best is not None:
            self.position, self.matched = best, best_len

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens from the track's place, stopping at a document's end."""
        if self.position is None:
            return []
        out = self.tokens[self.position : self.position + k]
        if SEPARATOR in out:
            out = out[: out.index(SEPARATOR)]
        return out

    def _occurrences(self) -> dict[tuple[int, ...], list[int]]:
        """Every :data:`MIN_MATCH`-gram of the track -> the positions right after it."""
        if self._index is None:
            index: dict[tuple[int, ...], list[int]] = {}
            tokens = self.tokens
            for end in range(MIN_MATCH, len(tokens) + 1):
                key = tuple(tokens[end - MIN_MATCH : end])
                if SEPARATOR not in key:
                    index.setdefault(key, []).append(end)
            self._index = index
        return self._index


@dataclass(frozen=True)
class Proposal:
    """A track's draft and how well the answer's recent tokens back it."""

    tokens: list[int]
    matched: int
    aligned: bool

    @property
    def backed(self) -> bool:
        """Whether this proposal should replace the engine's own: the prediction still
        aligned with the answer, or a place at least :data:`MIN_MATCH` tokens long."""
        return bool(self.tokens) and (self.aligned or self.matched >= MIN_MATCH)


class RequestDrafts:
    """The gateway's drafts for one request."""

    def __init__(self, prediction: Sequence[int] = (), documents: Sequence[int] = ()) -> None:
        self.tracks: list[Track] = []
        if prediction:
            self.tracks.append(Track(list(prediction), 0))
        if documents:
            self.tracks.append(Track(list(documents)))
        self.seen = 0
        """Answer tokens already followed."""

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

    def propose(self, new_tokens: Sequence[int], tail: Sequence[int], k: int) -> Proposal:
        """Follow the answer's ``new_tokens`` (those since the last call), re-anchor lost
        tracks on the context's last tokens ``tail``, and propose up to ``k`` tokens."""
        for token in new_tokens:
            for track in self.tracks:
                track.follow(token)
        self.seen += len(new_tokens)
        best = Proposal([], 0, False)
        for track in self.tracks:
            if track.position is None:
                track.anchor(tail)
            proposal = Proposal(track.draft(_length(track, k)), track.matched, track.aligned)
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
    starts with the gateway's and goes further), else vLLM's own."""
    if not gateway.backed:
        return own
    ours = gateway.tokens
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
