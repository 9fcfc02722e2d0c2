"""A stand-in for an SGLang or vLLM server, backed by the real local engine.

It speaks the wire formats remote verification uses (see
``gateway/endpoints/remote/wire.py``): SGLang's ``/generate`` (token ids in, top
logprobs of the input from ``logprob_start_len``, streamed or not, ``extra_key``),
vLLM 0.32's token-in ``/inference/v1/generate`` (only with ``scale_out``, as
``--enable-scale-out``), both servers' ``/tokenize`` and ``/version``, and the OpenAI
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` that pass-through
requests reach (their ``vllm_xargs`` checked as vLLM types it, and kept in ``xargs``).

Decoding (every generate request with no logprobs asked, and the OpenAI routes) is the
engine's own greedy decoding, without drafts. Scoring is a batch-1 forward of the model
over the tokens not already in a one-sequence prefix cache (per salt: ``extra_key`` /
``cache_salt``); the engine's steps and these forwards are the same arithmetic, which the
gateway's self-test then measures rather than assumes.

What vLLM 0.32 does, reproduced: its prefix cache serves whole blocks of ``VLLM_BLOCK``
tokens, and a request with ``prompt_logprobs`` and ``skip_reading_prefix_cache: false``
that hits it gets a row for every prompt position, the rows of served positions
uninitialised (arbitrary ids, negative or outside the vocabulary, ranks below 1, logprobs
above 0, and with ``nonfinite_garbage`` NaN and inf, which make the answer vLLM's 400 "Out
of range float values are not JSON compliant"); ``usage.prompt_tokens_details
.cached_tokens`` only with ``prompt_tokens_details`` (``--enable-prompt-tokens-details``);
output ``top_logprobs`` as ``{token_id, logprob, rank}`` objects; token ids that are
negative or outside the vocabulary, and contexts over ``MAX_MODEL_LEN``, refused with 400.

``fail_scores_after``, ``gone_after_scores``, ``fail_all``, ``perturb_every``,
``tie_every`` and ``corrupt`` (with ``corrupt_after_scores``) inject the failures, the
disagreement, the near ties and the hostile answers the tests need.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from local_verifier.engine import END, Engine, Failed, GenerationRequest, GenerationStats
from local_verifier.sampling import SamplingParams
from local_verifier.testing.kv_cache import forward, new_cache

MAX_MODEL_LEN = 2048
VLLM_BLOCK = 16  # vLLM's GPU block; its CPU backend's is 128
VLLM_VERSION = "0.32.0"
NON_FINITE = "Out of range float values are not JSON compliant"
Corruption = Literal["not-json", "list-event", "huge-line", "trickle", "huge-body", "oov-ids"]


class _Scorer:
    """Logits of given tokens with a one-sequence prefix cache (the last request's ids and
    salt)."""

    def __init__(self, engine: Engine, max_len: int = MAX_MODEL_LEN) -> None:
        self.engine = engine
        self.cache = new_cache(engine.lm, max_len)
        self.ids: list[int] = []
        self.salt: str | None = None
        self.lock = threading.Lock()

    def logprobs(
        self, ids: list[int], start: int | None, salt: str | None = None, block: int = 1
    ) -> tuple[torch.Tensor, int, int]:
        """(log-softmax rows for positions ``first..len(ids) - 1``, ``first``, cached tokens):
        ``first`` is ``start``, or with ``None`` the first position not in the cache (which
        serves whole blocks of ``block`` tokens, and never the last token)."""
        with self.lock, torch.no_grad():
            if not self.engine.wait_idle(60):  # the model's steps never overlap
                raise RuntimeError("the engine did not go idle")
            same = 0
            if salt == self.salt:
                for a, b in zip(self.ids, ids, strict=False):
                    if a != b:
                        break
                    same += 1
            reuse = min(same, len(ids) - 1, self.cache.length)
            if start is not None:
                reuse = min(reuse, start)
            reuse -= reuse % block
            first = reuse if start is None else start
            self.cache.truncate(reuse)
            logits = forward(self.engine.lm.model, torch.tensor(ids[reuse:]), self.cache)
            self.ids, self.salt = list(ids), salt
            return torch.log_softmax(logits[first - reuse :].float(), dim=-1), first, reuse


class RemoteStandIn:
    """The stand-in's state and Starlette app (``app``); counters for the tests."""

    def __init__(
        self, engine: Engine, *, scale_out: bool = True, prompt_tokens_details: bool = True
    ) -> None:
        self.engine = engine
        self.vocab_size = int(engine.lm.config.vocab_size)
        self.scale_out = scale_out  # vLLM's --enable-scale-out: the token-in endpoint
        self.prompt_tokens_details = prompt_tokens_details  # --enable-prompt-tokens-details
        self.nonfinite_garbage = False  # uninitialised rows may hold NaN and inf
        # one prefix cache per API, as if each were a server of its own
        self.scorers = {"sglang": _Scorer(engine), "vllm": _Scorer(engine)}
        self.fail_scores_after: int | None = None  # scoring answers 503 after this many
        self.gone_after_scores: int | None = None  # every route 503s after this many scores
        self.fail_all = False  # every route answers 503 (the server is gone)
        self.perturb_every = 0  # >0: every k-th scored position's top-1 is replaced
        self.tie_every = 0  # >0: every k-th scored position's top-2 ties its top-1
        self.corrupt: Corruption | None = None  # generate answers turn hostile ...
        self.corrupt_after_scores = 0  # ... once this many scores were answered
        self.set_cookie = False  # every answer sets a cookie
        self.reports_context = True  # /tokenize and /v1/models tell max_model_len
        self.scores = 0
        self.decodes = 0
        self.garbage_rows = 0  # uninitialised rows sent (vLLM, cache read)
        self.salts: list[tuple[str, str | None]] = []  # each generate request's API and salt
        self.cached: list[int] = []  # each scoring request's cached tokens
        self.cookies: list[str] = []  # Cookie headers received
        self.xargs: list[Any] = []  # each OpenAI request's vllm_xargs (None: absent)
        self.busy = asyncio.Lock()  # one request on the model at a time, like one GPU
        # one thread for every forward (a thread's first forward pays a warm-up), with one
        # torch thread: a second OpenMP team beside the engine thread's would fight it
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix="standin-score", initializer=torch.set_num_threads, initargs=(1,)
        )
        self.app = Starlette(
            routes=[
                Route("/generate", self._sglang_generate, methods=["POST"]),
                Route("/inference/v1/generate", self._vllm_generate, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/version", self._version, methods=["GET"]),
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/completions", self._openai, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def reset(self) -> None:
        self.scale_out = True
        self.prompt_tokens_details = True
        self.nonfinite_garbage = False
        self.fail_scores_after = None
        self.gone_after_scores = None
        self.fail_all = False
        self.perturb_every = 0
        self.tie_every = 0
        self.corrupt = None
        self.corrupt_after_scores = 0
        self.set_cookie = False
        self.scores = 0
        self.decodes = 0
        self.garbage_rows = 0
        self.salts.clear()
        self.cached.clear()
        self.cookies.clear()
        self.xargs.clear()

    async def _on_scorer_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _body(self, request: Request) -> dict[str, Any]:
        if "cookie" in request.headers:
            self.cookies.append(request.headers["cookie"])
        body: dict[str, Any] = await request.json()
        return body

    def _answer(self, response: Response) -> Response:
        if self.set_cookie:
            response.set_cookie("upstream-session", uuid.uuid4().hex)
        return response

    def _hostile(self) -> bool:
        return self.corrupt is not None and self.scores >= self.corrupt_after_scores

    # -- the engine ------------------------------------------------------------------------

    async def _generate(self, gen: GenerationRequest) -> AsyncIterator[Any]:
        """The engine's items (``TextDelta`` then ``GenerationStats``) for ``gen``."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()

        def deliver(item: Any) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        async with self.busy:
            handle = self.engine.submit(gen, deliver)
            try:
                while (item := await items.get()) is not END:
                    if isinstance(item, Failed):
                        raise item.error
                    yield item
            finally:
                handle.cancel()

    async def _greedy_ids(
        self, api: str, ids: list[int], max_tokens: int
    ) -> AsyncIterator[list[int]]:
        """Greedy token ids after ``ids``, ending with the EOS token when one was chosen."""
        self.decodes += 1
        gen = GenerationRequest(
            prompt_ids=ids, params=SamplingParams(temperature=0.0), max_tokens=max_tokens
        )
        gen.draft = False
        out: list[int] = []
        async for item in self._generate(gen):
            if isinstance(item, GenerationStats):
                if item.finish_reason == "stop" and len(out) < max_tokens:
                    rows, _, _ = await self._on_scorer_thread(
                        self.scorers[api].logprobs, ids + out, len(ids + out) - 1
                    )
                    yield [int(rows[-1].argmax())]
            elif item.token_ids:
                out += item.token_ids
                yield list(item.token_ids)

    async def _score(
        self, api: str, ids: list[int], start: int | None, k: int, salt: str | None
    ) -> tuple[Any, int, int]:
        """Top-``k`` (values, ids) per position from ``first`` on, ``first``, cached tokens."""
        self.scores += 1
        if self.gone_after_scores is not None and self.scores > self.gone_after_scores:
            self.fail_all = True
        if self.fail_all or (
            self.fail_scores_after is not None and self.scores > self.fail_scores_after
        ):
            raise _Unavailable
        block = VLLM_BLOCK if api == "vllm" else 1
        async with self.busy:
            rows, first, cached = await self._on_scorer_thread(
                self.scorers[api].logprobs, ids, start, salt, block
            )
        self.cached.append(cached)
        top = torch.topk(rows, k, dim=-1)
        values, indices = top.values.tolist(), top.indices.tolist()
        if self.perturb_every:
            for i in range(len(indices)):
                if (first + i) % self.perturb_every == 0:
                    indices[i][0] = (indices[i][0] + 1) % rows.shape[-1]
        if self.tie_every and k > 1:
            for i in range(len(values)):
                if (first + i) % self.tie_every == 0:
                    values[i][1] = values[i][0]
        return list(zip(values, indices, strict=True)), first, cached

    def _refused_ids(self, ids: list[int], extra: int = 0) -> Response | None:
        """vLLM's and SGLang's 400 for ids they cannot take (negative, outside the
        vocabulary, a context over the model's)."""
        if any(t < 0 or t >= self.vocab_size for t in ids):
            return _bad_request("token id out of vocabulary")
        if len(ids) + extra > MAX_MODEL_LEN:
            return _bad_request(
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, "
                f"you requested {len(ids) + extra} tokens."
            )
        return None

    async def _hostile_answer(self, stream: bool) -> Response:
        """What an upstream that cannot be trusted answers (``corrupt``)."""
        kind = self.corrupt
        if kind == "huge-body":
            return Response(b'{"pad": "' + b"x" * (64 << 20) + b'"}', media_type="application/json")
        if kind == "not-json":
            body = b"data: {not json\n\n" if stream else b"{not json"
            media = "text/event-stream" if stream else "application/json"
            return Response(body, media_type=media)
        if kind == "list-event":
            if stream:
                return Response(b"data: [1, 2, 3]\n\n", media_type="text/event-stream")
            return JSONResponse([1, 2, 3])
        if kind == "huge-line":
            return Response(b"data: " + b"1" * (4 << 20) + b"\n\n", media_type="text/event-stream")
        if kind == "oov-ids":
            ids = [self.vocab_size + 7, -3]
            if stream:
                event = {"choices": [{"index": 0, "token_ids": ids}], "output_ids": ids}
                body = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
                return Response(body, media_type="text/event-stream")
            return JSONResponse({"choices": [{"token_ids": ids}], "prompt_logprobs": None})

        async def trickle() -> AsyncIterator[bytes]:  # a byte now and then, never the end
            while True:
                yield b" "
                await asyncio.sleep(0.05)

        return StreamingResponse(trickle(), media_type="text/event-stream")

    # -- SGLang ----------------------------------------------------------------------------

    async def _sglang_generate(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await self._body(request)
        ids = [int(t) for t in body["input_ids"]]
        salt = body.get("extra_key")
        self.salts.append(("sglang", salt))
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        refused = self._refused_ids(ids)
        if refused is not None:
            return refused
        if self._hostile():
            return await self._hostile_answer(bool(body.get("stream")))
        rid = uuid.uuid4().hex
        if body.get("return_logprob"):
            start = int(body.get("logprob_start_len", -1))
            start = len(ids) - 1 if start < 0 else start
            try:
                top_k = int(body.get("top_logprobs_num", 0))
                rows, _, cached = await self._score("sglang", ids, start, top_k, salt)
            except _Unavailable:
                return _unavailable()
            tops = [[[v, i, None] for v, i in zip(*row, strict=True)] for row in rows]
            next_id = tops[-1][0][1]
            meta = {
                "id": rid,
                "finish_reason": {"type": "length", "length": 1},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": cached,
                "input_token_logprobs": [[None, ids[start], None]]
                + [
                    [rows[j - 1][0][rows[j - 1][1].index(ids[start + j])], ids[start + j], None]
                    if ids[start + j] in rows[j - 1][1]
                    else [None, ids[start + j], None]
                    for j in range(1, len(ids) - start)
                ],
                "input_top_logprobs": [None, *tops[:-1]],
                "output_token_logprobs": [[tops[-1][0][0], next_id, None]],
                "output_top_logprobs": [tops[-1]],
            }
            return self._answer(
                JSONResponse({"text": "", "output_ids": [next_id], "meta_info": meta})
            )

        async def events() -> AsyncIterator[bytes]:
            out: list[int] = []
            async for new in self._greedy_ids("sglang", ids, max_new):
                out += new
                meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out)}
                event = {"text": "", "output_ids": list(out), "meta_info": meta}
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return self._answer(StreamingResponse(events(), media_type="text/event-stream"))
        out = [t async for new in self._greedy_ids("sglang", ids, max_new) for t in new]
        meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out)}
        return self._answer(JSONResponse({"text": "", "output_ids": out, "meta_info": meta}))

    # -- vLLM ------------------------------------------------------------------------------

    def _garbage_row(self, rng: random.Random) -> dict[str, Any]:
        """An uninitialised ``prompt_logprobs`` row: sometimes plausible (ids in the
        vocabulary, ranks 1 and 2, logprobs below 0), sometimes plainly wrong."""
        self.garbage_rows += 1
        kind = rng.randrange(3 if self.nonfinite_garbage else 2)
        if kind == 0:
            a, b = rng.sample(range(self.vocab_size), 2)
            top = -rng.random()
            return {
                str(a): {"logprob": top, "rank": 1, "decoded_token": None},
                str(b): {"logprob": top - rng.random(), "rank": 2, "decoded_token": None},
            }
        if kind == 1:
            return {
                str(rng.choice([234818303, -64513, self.vocab_size])): {
                    "logprob": 163.7,
                    "rank": -2067090176,
                    "decoded_token": None,
                },
                str(rng.randrange(self.vocab_size)): {
                    "logprob": -1e-3,
                    "rank": rng.choice([0, 1]),
                    "decoded_token": None,
                },
            }
        return {
            str(rng.randrange(self.vocab_size)): {
                "logprob": rng.choice([math.nan, math.inf, -math.inf]),
                "rank": 1,
                "decoded_token": None,
            }
        }

    async def _vllm_generate(self, request: Request) -> Response:
        if not self.scale_out:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if self.fail_all:
            return _unavailable()
        body = await self._body(request)
        ids = [int(t) for t in body["token_ids"]]
        salt = body.get("cache_salt")
        self.salts.append(("vllm", salt))
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_tokens", 16))
        refused = self._refused_ids(ids, max_tokens)
        if refused is not None:
            return refused
        if self._hostile():
            return await self._hostile_answer(bool(body.get("stream")))
        rid = f"generate-tokens-{uuid.uuid4().hex}"
        k = params.get("prompt_logprobs")
        if k is not None:
            skip = params.get("skip_reading_prefix_cache")
            start = 0 if skip or skip is None else None  # vLLM's default: skip
            try:
                rows, first, cached = await self._score("vllm", ids, start, max(int(k), 2), salt)
            except _Unavailable:
                return _unavailable()
            rng = random.Random(self.scores)
            prompt_logprobs: list[Any] = [None]
            for pos in range(1, len(ids)):
                if pos - 1 < first:  # a position read from the cache: not computed
                    prompt_logprobs.append(self._garbage_row(rng))
                    continue
                values, indices = rows[pos - 1 - first]
                entry = {
                    str(i): {"logprob": v, "rank": r + 1, "decoded_token": None}
                    for r, (v, i) in enumerate(zip(values[:k], indices[:k], strict=True))
                }
                if str(ids[pos]) not in entry:
                    entry[str(ids[pos])] = {
                        "logprob": -9999.0,
                        "rank": k + 1,
                        "decoded_token": None,
                    }
                prompt_logprobs.append(entry)
            values, indices = rows[-1]
            n_top = max(int(params.get("logprobs") or 1), 1)
            content = {
                "token_id": indices[0],
                "logprob": values[0],
                "rank": 1,
                "top_logprobs": [
                    {"token_id": i, "logprob": v, "rank": r + 1}
                    for r, (v, i) in enumerate(zip(values[:n_top], indices[:n_top], strict=True))
                ],
            }
            choice = {
                "index": 0,
                "logprobs": {"content": [content]},
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [indices[0]],
            }
            usage: dict[str, Any] = {
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "total_tokens": len(ids) + 1,
                "prompt_tokens_details": (
                    {"cached_tokens": cached} if self.prompt_tokens_details else None
                ),
            }
            answer = {
                "request_id": rid,
                "created": int(time.time()),
                "usage": usage,
                "prompt_logprobs": prompt_logprobs,
                "prompt_token_id_logprobs": None,
                "kv_transfer_params": None,
                "output_mode": "tokens",
                "choices": [choice],
            }
            try:  # Starlette refuses NaN and inf, and vLLM turns that ValueError into a 400
                return self._answer(JSONResponse(answer))
            except ValueError:
                return _bad_request(NON_FINITE)

        async def events() -> AsyncIterator[bytes]:
            async for new in self._greedy_ids("vllm", ids, max_tokens):
                chunk = {
                    "request_id": rid,
                    "choices": [
                        {"index": 0, "logprobs": None, "finish_reason": None, "token_ids": new}
                    ],
                }
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return self._answer(StreamingResponse(events(), media_type="text/event-stream"))
        out = [t async for new in self._greedy_ids("vllm", ids, max_tokens) for t in new]
        choice = {"index": 0, "logprobs": None, "finish_reason": "stop", "token_ids": out}
        return self._answer(
            JSONResponse({"request_id": rid, "choices": [choice], "prompt_logprobs": None})
        )

    async def _tokenize(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await self._body(request)
        tokenizer = self.engine.tokenizer
        tokens = tokenizer.encode(body["prompt"], bool(body.get("add_special_tokens", True)))
        answer: dict[str, Any] = {"tokens": tokens, "count": len(tokens)}
        if self.reports_context:
            answer["max_model_len"] = MAX_MODEL_LEN
        return self._answer(JSONResponse(answer))

    async def _version(self, request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    # -- OpenAI (pass-through) -------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        card: dict[str, Any] = {"id": "smollm2", "object": "model"}
        if self.reports_context:
            card["max_model_len"] = MAX_MODEL_LEN
        return JSONResponse({"object": "list", "data": [card]})

    async def _openai(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await self._body(request)
        asked = [m.get("content") or "" for m in body.get("messages") or []] + [
            body.get("prompt") or ""
        ]
        if sum(len(t) for t in asked if isinstance(t, str)) > MAX_MODEL_LEN * 8:
            # vLLM counts tokens; eight characters a token bounds it without the work
            return _bad_request(f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")
        xargs = body.get("vllm_xargs")
        if xargs is not None and not _valid_xargs(xargs):
            return _bad_request("vllm_xargs: Input should be a valid dictionary of scalars")
        self.xargs.append(xargs)
        chat = request.url.path.endswith("chat/completions")
        gen = GenerationRequest(
            params=SamplingParams(
                temperature=1.0 if body.get("temperature") is None else body["temperature"],
                seed=body.get("seed"),
            ),
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            stop=[body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or [],
        )
        gen.draft = False
        if chat:
            gen.messages = body["messages"]
        else:
            gen.prompt = body["prompt"]
        obj = "chat.completion" if chat else "text_completion"
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": body["model"],
        }

        def choice(text: str | None, finish: str | None) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text or "", "finish_reason": finish}
            delta = {"content": text} if text is not None else {}
            return {"index": 0, "delta": delta, "finish_reason": finish}

        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                kind = f"{obj}.chunk" if chat else obj
                async for item in self._generate(gen):
                    if isinstance(item, GenerationStats):
                        last = {
                            **head,
                            "object": kind,
                            "choices": [choice(None, item.finish_reason)],
                        }
                        yield b"data: " + json.dumps(last).encode() + b"\n\n"
                    elif item.text:
                        event = {**head, "object": kind, "choices": [choice(item.text, None)]}
                        yield b"data: " + json.dumps(event).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        texts: list[str] = []
        stats: GenerationStats | None = None
        async for item in self._generate(gen):
            if isinstance(item, GenerationStats):
                stats = item
            else:
                texts.append(item.text)
        assert stats is not None
        text = "".join(texts)
        answer = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        answer["finish_reason"] = stats.finish_reason
        usage = {
            "prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        }
        return JSONResponse({**head, "object": obj, "choices": [answer], "usage": usage})


class _Unavailable(Exception):
    pass


def _valid_xargs(xargs: Any) -> bool:
    """vLLM 0.32's type of ``vllm_xargs``: ``dict[str, str | int | float | list[str | int |
    float]]`` (becomes ``SamplingParams.extra_args``, integers within 64 bits)."""

    def scalar(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            return False
        return not isinstance(v, int) or -(2**63) <= v < 2**64

    return isinstance(xargs, dict) and all(
        isinstance(k, str) and (scalar(v) or (isinstance(v, list) and all(map(scalar, v))))
        for k, v in xargs.items()
    )


def _unavailable() -> Response:
    return JSONResponse({"error": {"message": "the server is unavailable"}}, status_code=503)


def _bad_request(message: str) -> Response:
    """vLLM's ``ErrorResponse`` for a 400."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return JSONResponse({"error": error}, status_code=400)
