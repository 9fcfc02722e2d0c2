"""The two engine APIs remote verification speaks: SGLang's ``/generate`` and vLLM's
token-in ``/inference/v1/generate``, plus both servers' ``/tokenize``.

Fields relied on, checked against the engines' sources:

SGLang (``python/sglang/srt/managers/io_struct.py`` ``GenerateReqInput``,
``entrypoints/http_server.py``, the scheduler's logprob output):

- request: ``input_ids``, ``sampling_params`` (``max_new_tokens``, ``temperature``),
  ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``, ``stream``.
- response: ``output_ids`` and ``meta_info`` with ``cached_tokens``,
  ``input_top_logprobs`` and ``output_top_logprobs``. ``input_top_logprobs`` holds one entry
  per input position from ``logprob_start_len`` on; entry 0 is always ``null`` and entry
  ``j`` is the top-k list ``[[logprob, token_id, text|null], ...]`` (best first) of the
  distribution that predicted ``input_ids[logprob_start_len + j]``. ``output_top_logprobs[0]``
  is the distribution after the last input token. The radix cache serves the input up to
  ``logprob_start_len``; only the positions after it are computed.
- streaming: ``data: {...}`` events whose ``output_ids`` are cumulative unless the server
  runs ``--incremental-streaming-output`` (then each event's own); ``meta_info``'s
  ``completion_tokens`` is always cumulative, which tells the two apart. ``data: [DONE]``
  ends the stream.

vLLM (``vllm/entrypoints/serve/disagg/protocol.py`` and ``serving.py``,
``vllm/logprobs.py``):

- request ``POST /inference/v1/generate``: ``token_ids``, ``sampling_params``
  (``max_tokens``, ``temperature``, ``prompt_logprobs``, ``logprobs``, ``detokenize``,
  ``skip_reading_prefix_cache``), ``stream``.
- response: ``choices[0].token_ids``, ``choices[0].logprobs.content[0].top_logprobs``
  (``token`` spelled ``token_id:N``), ``prompt_logprobs``: one entry per prompt token,
  ``null`` for the first, else ``{"<token id>": {"logprob", "rank", "decoded_token"}}``
  holding the top-k (``rank`` 1 is the argmax) and the prompt token itself. A request
  with ``prompt_logprobs`` skips reading the prefix cache unless
  ``skip_reading_prefix_cache`` is ``false``, which is sent; positions read from the cache
  then carry no logprobs, so only the list's last entries are read, and a draft found
  wholly in the cache (the same tokens scored before) is asked again with the cache
  skipped.
- streaming: ``data: {"choices": [{"token_ids": [...]}]}`` deltas, then ``data: [DONE]``.

Both ``/tokenize``: ``{"prompt": text, "add_special_tokens": bool}`` answers
``{"tokens": [...], "count": n, ...}``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

TOP_K = 2  # two alternatives per position: the argmax and the gap to the runner-up


class RemoteFailure(Exception):
    """A round trip to the engine failed (unreachable, an error status, a bad answer)."""


@dataclass(frozen=True)
class Scored:
    """One scoring round trip: the engine's greedy token at each draft position and after
    the whole input, each position's top-1 minus top-2 logprob, and the cached tokens."""

    top1: list[int]  # len(draft) + 1: the argmax before each draft token, then after all
    gaps: list[float]  # same length; inf where the engine reported one alternative only
    cached_tokens: int
    seconds: float
    requests: int = 1  # HTTP requests it took


def _gap(values: Sequence[float]) -> float:
    ordered = sorted(values, reverse=True)
    return ordered[0] - ordered[1] if len(ordered) > 1 else math.inf


class EngineClient(Protocol):
    """What the verify loop needs of an engine."""

    async def score(self, ids: Sequence[int], n_draft: int) -> Scored: ...

    def decode(self, ids: Sequence[int], max_tokens: int) -> AsyncIterator[list[int]]: ...

    async def tokenize(self, text: str) -> list[int]: ...

    async def aclose(self) -> None: ...


class _Client:
    """An httpx client on the server's root URL (``/v1`` removed)."""

    def __init__(
        self,
        root: str,
        headers: Mapping[str, str],
        timeout_s: float,
        connect_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=root,
            headers=dict(headers),
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
        )

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise RemoteFailure(f"{path}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise RemoteFailure(f"{path}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise RemoteFailure(f"{path}: the answer is not JSON") from None

    async def _events(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The JSON events of a streamed answer, up to ``[DONE]``."""
        try:
            async with self.http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raise RemoteFailure(f"{path}: HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event:
                        raise RemoteFailure(f"{path}: the stream ended with an error")
                    yield event
        except (httpx.HTTPError, ValueError) as exc:
            raise RemoteFailure(f"{path}: {type(exc).__name__}") from None
        raise RemoteFailure(f"{path}: the stream ended before [DONE]")

    async def tokenize(self, text: str) -> list[int]:
        answer = await self._post("/tokenize", {"prompt": text, "add_special_tokens": False})
        try:
            return [int(t) for t in answer["tokens"]]
        except (KeyError, TypeError, ValueError):
            raise RemoteFailure("/tokenize: no token list in the answer") from None

    async def aclose(self) -> None:
        await self.http.aclose()


class SGLangClient(_Client):
    """SGLang's native ``/generate``."""

    async def score(self, ids: Sequence[int], n_draft: int) -> Scored:
        start = len(ids) - n_draft - 1
        t0 = time.perf_counter()
        answer = await self._post(
            "/generate",
            {
                "input_ids": list(ids),
                "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True,
                "logprob_start_len": start,
                "top_logprobs_num": TOP_K,
                "stream": False,
            },
        )
        seconds = time.perf_counter() - t0
        try:
            meta = answer["meta_info"]
            rows = [*meta["input_top_logprobs"][1 : n_draft + 1], meta["output_top_logprobs"][0]]
            top1 = [int(row[0][1]) for row in rows]
            gaps = [_gap([float(entry[0]) for entry in row]) for row in rows]
            cached = int(meta.get("cached_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError):
            raise RemoteFailure("/generate: the answer lacks the requested logprobs") from None
        if len(top1) != n_draft + 1:
            raise RemoteFailure("/generate: logprobs for fewer positions than asked")
        return Scored(top1, gaps, cached, seconds)

    async def decode(self, ids: Sequence[int], max_tokens: int) -> AsyncIterator[list[int]]:
        body = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
            "stream": True,
        }
        seen = 0
        async for event in self._events("/generate", body):
            out = [int(t) for t in event.get("output_ids") or []]
            total = int((event.get("meta_info") or {}).get("completion_tokens", len(out)))
            new = out[seen:] if len(out) == total else out
            seen = total
            if new:
                yield new


class VLLMClient(_Client):
    """vLLM's token-in ``/inference/v1/generate``."""

    def _params(self, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {"max_tokens": max_tokens, "temperature": 0, "detokenize": False, **extra}

    async def score(self, ids: Sequence[int], n_draft: int) -> Scored:
        t0 = time.perf_counter()
        scored = await self._score(ids, n_draft, t0, reuse_cache=True)
        if scored is not None:
            return scored
        # the draft was read from the cache: no logprobs came back for it
        scored = await self._score(ids, n_draft, t0, reuse_cache=False)
        if scored is None:
            raise RemoteFailure("/inference/v1/generate: no logprobs for the draft")
        return dataclasses.replace(scored, requests=2)

    async def _score(
        self, ids: Sequence[int], n_draft: int, t0: float, *, reuse_cache: bool
    ) -> Scored | None:
        answer = await self._post(
            "/inference/v1/generate",
            {
                "token_ids": list(ids),
                "sampling_params": self._params(
                    1,
                    prompt_logprobs=TOP_K,
                    logprobs=TOP_K,
                    skip_reading_prefix_cache=not reuse_cache,
                ),
                "stream": False,
            },
        )
        seconds = time.perf_counter() - t0
        try:
            rows = answer["prompt_logprobs"]
            prompt = rows[len(rows) - n_draft :] if n_draft else []
            if len(prompt) != n_draft or any(row is None for row in prompt):
                return None
            top1: list[int] = []
            gaps: list[float] = []
            for row in prompt:
                best = min(row.items(), key=lambda item: item[1]["rank"])
                top1.append(int(best[0]))
                gaps.append(_gap([float(v["logprob"]) for v in row.values()]))
            choice = answer["choices"][0]
            top1.append(int(choice["token_ids"][0]))
            after = choice["logprobs"]["content"][0]["top_logprobs"]
            gaps.append(_gap([float(v["logprob"]) for v in after]))
            usage = answer.get("usage") or {}
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise RemoteFailure("/inference/v1/generate: the answer lacks the logprobs") from None
        return Scored(top1, gaps, cached, seconds)

    async def decode(self, ids: Sequence[int], max_tokens: int) -> AsyncIterator[list[int]]:
        body = {"token_ids": list(ids), "sampling_params": self._params(max_tokens), "stream": True}
        async for event in self._events("/inference/v1/generate", body):
            for choice in event.get("choices") or []:
                new = [int(t) for t in choice.get("token_ids") or []]
                if new:
                    yield new


def engine_client(
    kind: str,
    root: str,
    headers: Mapping[str, str],
    timeout_s: float,
    connect_timeout_s: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> EngineClient:
    """The client for an ``sglang`` or ``vllm`` endpoint's server root."""
    cls = SGLangClient if kind == "sglang" else VLLMClient
    return cls(root, headers, timeout_s, connect_timeout_s, transport)
