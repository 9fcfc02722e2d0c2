"""The two engine APIs remote verification speaks: SGLang's ``/generate`` and vLLM's
token-in ``/inference/v1/generate``, plus both servers' ``/tokenize`` and ``/version``.

Fields relied on, checked against the engines' sources:

SGLang (``python/sglang/srt/managers/io_struct.py`` ``GenerateReqInput``,
``entrypoints/http_server.py``, the scheduler's logprob output):

- request: ``input_ids``, ``sampling_params`` (``max_new_tokens``, ``temperature``),
  ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``, ``stream``,
  ``extra_key`` (the radix cache's namespace: one per tenant).
- response: ``output_ids`` and ``meta_info`` with ``input_top_logprobs`` and
  ``output_top_logprobs``. ``input_top_logprobs`` holds one entry per input position from
  ``logprob_start_len`` on; entry 0 is always ``null`` and entry ``j`` is the top-k list
  ``[[logprob, token_id, text|null], ...]`` (best first) of the distribution that predicted
  ``input_ids[logprob_start_len + j]``. ``output_top_logprobs[0]`` is the distribution
  after the last input token. The radix cache serves the input up to
  ``logprob_start_len``; only the positions after it are computed and returned.
- streaming: ``data: {...}`` events whose ``output_ids`` are cumulative unless the server
  runs ``--incremental-streaming-output`` (then each event's own); ``meta_info``'s
  ``completion_tokens`` is always cumulative, which tells the two apart. ``data: [DONE]``
  ends the stream.

vLLM (``vllm/entrypoints/scale_out/token_in_token_out/protocol.py`` and ``serving.py``,
served with ``--enable-scale-out``; ``vllm/sampling_params.py``):

- request ``POST /inference/v1/generate``: ``token_ids``, ``sampling_params``
  (``max_tokens``, ``temperature``, ``prompt_logprobs``, ``logprobs``, ``detokenize``,
  ``skip_reading_prefix_cache``), ``stream``, ``cache_salt`` (the prefix cache's salt:
  one per tenant).
- response: ``choices[0].token_ids``; ``choices[0].logprobs.content[0]`` is
  ``{token_id, logprob, rank, top_logprobs: [{token_id, logprob, rank}, ...]}`` (the
  sampled token first); ``prompt_logprobs``: one entry per prompt token, ``null`` for the
  first, else ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` holding the top-k
  (``rank`` 1 is the argmax) and the prompt token itself; ``usage.prompt_tokens_details``
  ``.cached_tokens`` only when the server runs ``--enable-prompt-tokens-details``.
  A request with ``prompt_logprobs`` skips reading the prefix cache unless
  ``skip_reading_prefix_cache`` is ``false``; with ``false`` and a cache hit, vLLM 0.32
  still returns a row for every prompt position, and the rows of positions read from the
  cache are not computed (arbitrary ids, ranks and logprobs, NaN and inf among them, which
  make the server answer 400 "Out of range float values are not JSON compliant"). So the
  cache is read only when the answer says how many tokens it served
  (``cached_tokens``), only rows after those are read, and a draft reaching into the
  served part is asked again with the cache skipped. An answer without ``cached_tokens``,
  a row that fails the checks of :mod:`gateway.endpoints.remote.rows` or the 400 stop the
  client reading the cache (:attr:`VLLMClient.cache_note` says why).
- streaming: ``data: {"choices": [{"token_ids": [...]}]}`` deltas, then ``data: [DONE]``.

Both ``/tokenize``: ``{"prompt": text, "add_special_tokens": bool}`` answers
``{"tokens": [...], "count": n, "max_model_len": m}`` (where ``max_model_len`` is missing,
``GET /v1/models``'s model cards carry it); ``GET /version``: ``{"version": "..."}``.

The upstream is not trusted: every answer is bounded in bytes (a scoring answer by the
context's length, a stream line by :data:`MAX_LINE_BYTES`), every request by a total
deadline besides the per-read timeout, JSON without NaN/Infinity, every value checked
before use; whatever fails is a :class:`RemoteFailure`. The HTTP client keeps no cookies
and reads no proxy settings from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Protocol, TypeGuard

import httpx

from gateway.endpoints.remote import rows
from gateway.endpoints.remote.context import TokenIds
from gateway.endpoints.remote.failures import RemoteFailure, UnusableAnswer

TOP_K = 2  # two alternatives per position: the argmax and the gap to the runner-up
MAX_LINE_BYTES = 1 << 20  # one streamed event
SMALL_ANSWER_BYTES = 1 << 20  # /tokenize, /version, a scoring answer's fixed part
ROW_BYTES = 1024  # a scoring answer's bound grows by this per token of context
PARSE_OFF_LOOP_BYTES = 1 << 16  # larger answers are parsed on a worker thread
NON_FINITE = "not JSON compliant"  # vLLM's 400 when its answer holds NaN or inf
_VERSION = re.compile(r"^[A-Za-z0-9.+_-]{1,40}$")


@dataclass(frozen=True)
class Scored:
    """One scoring round trip: the engine's greedy token at each draft position and after
    the whole input, and each position's top-1 minus top-2 logprob."""

    top1: list[int]  # len(draft) + 1: the argmax before each draft token, then after all
    gaps: list[float]  # same length
    seconds: float
    requests: int = 1  # HTTP requests it took


@dataclass(frozen=True)
class Ask:
    """What every request of one answer carries: the vocabulary its ids must fall in and
    the tenant's cache salt."""

    vocab_size: int
    salt: str | None = None


class EngineClient(Protocol):
    """What the verify loop needs of an engine."""

    name: str  # the engine, as the endpoint's record names it
    max_model_len: int | None

    async def score(self, context: TokenIds, draft: Sequence[int], ask: Ask) -> Scored: ...

    def decode(self, context: TokenIds, max_tokens: int, ask: Ask) -> AsyncIterator[list[int]]: ...

    async def tokenize(self, text: str) -> list[int]: ...

    async def version(self) -> str | None: ...

    def notes(self) -> list[str]: ...

    async def aclose(self) -> None: ...


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(body: bytes) -> Any:
    return json.loads(body, parse_constant=_reject_constant)


async def _parse(body: bytes, path: str) -> Any:
    try:
        if len(body) > PARSE_OFF_LOOP_BYTES:
            return await asyncio.to_thread(_loads, body)
        return _loads(body)
    except (ValueError, RecursionError):
        raise RemoteFailure(f"{path}: the answer is not JSON") from None


def _positive(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _body(fields: dict[str, Any], key: str, ids: bytes) -> bytes:
    """``fields`` as a JSON object with ``key`` set to the already encoded ``ids``."""
    head = json.dumps(fields, separators=(",", ":")).encode()
    return head[:-1] + b',"' + key.encode() + b'":' + ids + b"}"


class _Client:
    """An httpx client on the server's root URL (``/v1`` removed), bounded and deadlined."""

    def __init__(
        self,
        root: str,
        headers: Mapping[str, str],
        timeout_s: float,
        connect_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.deadline_s = timeout_s  # a whole request, however slowly its bytes come
        self.max_model_len: int | None = None  # from /tokenize, once asked
        self.http = httpx.AsyncClient(
            base_url=root,
            headers={**headers, "content-type": "application/json"},
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
            trust_env=False,  # no proxy or netrc settings from the environment
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # none kept
            follow_redirects=False,
        )

    async def _read(self, response: httpx.Response, limit: int, path: str) -> bytes:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise RemoteFailure(f"{path}: the answer is over {limit} bytes")
        return bytes(body)

    async def _request(
        self, method: str, path: str, content: bytes | None = None, limit: int = SMALL_ANSWER_BYTES
    ) -> Any:
        """The parsed JSON answer of one request (``RemoteFailure`` on any failure;
        ``UnusableAnswer`` for vLLM's 400 on non-finite values)."""
        try:
            async with asyncio.timeout(self.deadline_s):
                async with self.http.stream(method, path, content=content) as response:
                    body = await self._read(response, limit, path)
        except TimeoutError:
            raise RemoteFailure(f"{path}: no answer within {self.deadline_s:g} s") from None
        except httpx.HTTPError as exc:
            raise RemoteFailure(f"{path}: {type(exc).__name__}") from None
        if response.status_code != 200:
            if response.status_code == 400 and NON_FINITE.encode() in body[:4096]:
                raise UnusableAnswer(f"{path}: HTTP 400, non-finite values in the answer")
            raise RemoteFailure(f"{path}: HTTP {response.status_code}")
        return await _parse(body, path)

    async def _post(self, path: str, body: bytes, limit: int = SMALL_ANSWER_BYTES) -> Any:
        return await self._request("POST", path, body, limit)

    async def _events(self, path: str, body: bytes) -> AsyncIterator[dict[str, Any]]:
        """The JSON events of a streamed answer, up to ``[DONE]``; each line bounded, the
        whole stream within the deadline."""
        end = time.monotonic() + self.deadline_s
        try:
            async with self.http.stream("POST", path, content=body) as response:
                if response.status_code != 200:
                    raise RemoteFailure(f"{path}: HTTP {response.status_code}")
                chunks = response.aiter_bytes()
                buffer = bytearray()
                while True:
                    while (cut := buffer.find(b"\n")) < 0:
                        if len(buffer) > MAX_LINE_BYTES:
                            raise RemoteFailure(f"{path}: a line over {MAX_LINE_BYTES} bytes")
                        left = end - time.monotonic()
                        if left <= 0:
                            raise TimeoutError
                        try:
                            buffer += await asyncio.wait_for(anext(chunks), left)
                        except StopAsyncIteration:
                            raise RemoteFailure(f"{path}: the stream ended before [DONE]") from None
                    line = bytes(buffer[:cut]).strip()
                    del buffer[: cut + 1]
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    event = await _parse(data, path)
                    if not isinstance(event, dict):
                        raise RemoteFailure(f"{path}: an event is not an object")
                    if "error" in event:
                        raise RemoteFailure(f"{path}: the stream ended with an error")
                    yield event
        except TimeoutError:
            raise RemoteFailure(f"{path}: the stream took over {self.deadline_s:g} s") from None
        except httpx.HTTPError as exc:
            raise RemoteFailure(f"{path}: {type(exc).__name__}") from None

    async def tokenize(self, text: str) -> list[int]:
        body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
        answer = await self._post("/tokenize", body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise RemoteFailure("/tokenize: no token list in the answer")
        length = answer.get("max_model_len")
        if _positive(length):
            self.max_model_len = length
        elif self.max_model_len is None:
            self.max_model_len = await self._served_context()
        return tokens

    async def _served_context(self) -> int | None:
        """The longest ``max_model_len`` ``GET /v1/models`` lists (both engines' model
        cards carry it), None when it lists none."""
        with contextlib.suppress(RemoteFailure):
            answer = await self._request("GET", "/v1/models")
            cards = answer.get("data") if isinstance(answer, dict) else None
            lengths = [c.get("max_model_len") for c in cards or [] if isinstance(c, dict)]
            found = [n for n in lengths if _positive(n)]
            if found:
                return max(found)
        return None

    async def version(self) -> str | None:
        """The server's version (``GET /version``), None when it does not say."""
        with contextlib.suppress(RemoteFailure):
            answer = await self._request("GET", "/version")
            value = answer.get("version") if isinstance(answer, dict) else None
            if isinstance(value, str) and _VERSION.match(value):
                return value
        return None

    def notes(self) -> list[str]:
        """What the client learned about the engine that limits how it is asked."""
        return []

    async def aclose(self) -> None:
        await self.http.aclose()


class SGLangClient(_Client):
    """SGLang's native ``/generate``."""

    name = "SGLang"

    async def score(self, context: TokenIds, draft: Sequence[int], ask: Ask) -> Scored:
        n_draft = len(draft)
        fields: dict[str, Any] = {
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": len(context) - 1,
            "top_logprobs_num": TOP_K,
            "stream": False,
        }
        if ask.salt is not None:
            fields["extra_key"] = ask.salt
        t0 = time.perf_counter()
        answer = await self._post(
            "/generate",
            _body(fields, "input_ids", context.json(draft)),
            SMALL_ANSWER_BYTES + ROW_BYTES * (n_draft + 1),
        )
        seconds = time.perf_counter() - t0
        try:
            meta = answer["meta_info"]
            found = [*meta["input_top_logprobs"][1 : n_draft + 1], meta["output_top_logprobs"][0]]
        except (KeyError, IndexError, TypeError):
            raise RemoteFailure("/generate: the answer lacks the requested logprobs") from None
        if len(found) != n_draft + 1:
            raise UnusableAnswer("/generate: logprobs for fewer positions than asked")
        checked = [rows.sglang_row(row, ask.vocab_size) for row in found]
        return Scored([t for t, _ in checked], [g for _, g in checked], seconds)

    async def decode(
        self, context: TokenIds, max_tokens: int, ask: Ask
    ) -> AsyncIterator[list[int]]:
        if self.max_model_len is not None:  # the engine refuses to pass its context
            max_tokens = min(max_tokens, self.max_model_len - len(context))
        if max_tokens <= 0:
            return
        fields: dict[str, Any] = {
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
            "stream": True,
        }
        if ask.salt is not None:
            fields["extra_key"] = ask.salt
        seen = 0
        async for event in self._events("/generate", _body(fields, "input_ids", context.json())):
            out = rows.token_ids(event.get("output_ids") or [], ask.vocab_size)
            meta = event.get("meta_info")
            total = meta.get("completion_tokens", len(out)) if isinstance(meta, dict) else len(out)
            if isinstance(total, bool) or not isinstance(total, int) or total < seen:
                raise UnusableAnswer("/generate: completion_tokens is not a running count")
            new = out[seen:] if len(out) == total else out
            seen = total
            if new:
                yield new


class VLLMClient(_Client):
    """vLLM's token-in ``/inference/v1/generate`` (``--enable-scale-out``)."""

    name = "vLLM"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache_note: str | None = None  # why the prefix cache is no longer read

    @property
    def reads_cache(self) -> bool:
        return self.cache_note is None

    def notes(self) -> list[str]:
        return [self.cache_note] if self.cache_note else []

    def _stop_reading_cache(self, why: str) -> None:
        if self.cache_note is None:
            self.cache_note = f"prefix cache not read for scoring: {why}"

    def _params(self, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {"max_tokens": max_tokens, "temperature": 0, "detokenize": False, **extra}

    async def score(self, context: TokenIds, draft: Sequence[int], ask: Ask) -> Scored:
        t0 = time.perf_counter()
        ids = context.json(draft)
        total = len(context) + len(draft)
        requests = 1
        if self.reads_cache:
            try:
                answer = await self._ask_scores(ids, total, ask, read_cache=True)
                scored = _vllm_scored(answer, total, len(draft), ask.vocab_size, read_cache=True)
            except UnusableAnswer as exc:
                # vLLM 0.32 answers rows of cached positions from uninitialised memory (a 400
                # when one is not finite): the round is asked again with every row computed
                scored = None
                self._stop_reading_cache(f"the engine answered unusable rows ({exc})")
            if isinstance(scored, tuple):
                return Scored(scored[0], scored[1], time.perf_counter() - t0)
            if isinstance(scored, str):
                self._stop_reading_cache(scored)
            requests = 2  # asked again with the cache skipped: the rows were not computed
        answer = await self._ask_scores(ids, total, ask, read_cache=False)
        scored = _vllm_scored(answer, total, len(draft), ask.vocab_size, read_cache=False)
        assert isinstance(scored, tuple)  # without the cache every row is computed
        return Scored(scored[0], scored[1], time.perf_counter() - t0, requests)

    async def _ask_scores(self, ids: bytes, total: int, ask: Ask, *, read_cache: bool) -> Any:
        fields: dict[str, Any] = {
            "sampling_params": self._params(
                1,
                prompt_logprobs=TOP_K,
                logprobs=TOP_K,
                skip_reading_prefix_cache=not read_cache,
            ),
            "stream": False,
        }
        if ask.salt is not None:
            fields["cache_salt"] = ask.salt
        return await self._post(
            "/inference/v1/generate",
            _body(fields, "token_ids", ids),
            SMALL_ANSWER_BYTES + ROW_BYTES * total,
        )

    async def decode(
        self, context: TokenIds, max_tokens: int, ask: Ask
    ) -> AsyncIterator[list[int]]:
        if self.max_model_len is not None:  # the engine refuses to pass its context
            max_tokens = min(max_tokens, self.max_model_len - len(context))
        if max_tokens <= 0:
            return
        fields: dict[str, Any] = {"sampling_params": self._params(max_tokens), "stream": True}
        if ask.salt is not None:
            fields["cache_salt"] = ask.salt
        body = _body(fields, "token_ids", context.json())
        async for event in self._events("/inference/v1/generate", body):
            choices = event.get("choices") or []
            if not isinstance(choices, list):
                raise UnusableAnswer("/inference/v1/generate: choices is not a list")
            for choice in choices:
                if not isinstance(choice, dict):
                    raise UnusableAnswer("/inference/v1/generate: a choice is not an object")
                new = rows.token_ids(choice.get("token_ids") or [], ask.vocab_size)
                if new:
                    yield new


def _vllm_scored(
    answer: Any, total: int, n_draft: int, vocab_size: int, *, read_cache: bool
) -> tuple[list[int], list[float]] | str | None:
    """The draft rows' and the next token's (argmax, gap), checked; ``None`` when the
    draft's rows were served by the cache (not computed); a reason string when the answer
    cannot say which rows were computed."""
    try:
        prompt_rows = answer["prompt_logprobs"]
        choice = answer["choices"][0]
        usage = answer.get("usage") or {}
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    except (KeyError, IndexError, TypeError, AttributeError):
        raise UnusableAnswer("/inference/v1/generate: the answer lacks the logprobs") from None
    if not isinstance(prompt_rows, list) or len(prompt_rows) != total:
        raise UnusableAnswer("/inference/v1/generate: not one prompt_logprobs row per token")
    if not isinstance(choice, dict):
        raise UnusableAnswer("/inference/v1/generate: a choice is not an object")
    if read_cache:
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None:
            return "the engine does not report cached_tokens (--enable-prompt-tokens-details)"
        if isinstance(cached, bool) or not isinstance(cached, int) or not 0 <= cached < total:
            raise UnusableAnswer("/inference/v1/generate: cached_tokens out of range")
        # row j predicts token j from position j - 1: computed when j - 1 >= cached
        if total - n_draft < cached + 1:
            return None
    checked = [rows.vllm_prompt_row(row, vocab_size) for row in prompt_rows[total - n_draft :]]
    sampled = rows.token_ids(choice.get("token_ids"), vocab_size)
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if len(sampled) != 1 or not isinstance(content, list) or len(content) != 1:
        raise UnusableAnswer("/inference/v1/generate: not one output token with logprobs")
    checked.append(rows.vllm_output_step(content[0], vocab_size))
    return [t for t, _ in checked], [g for _, g in checked]


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
