"""A stand-in for an SGLang or vLLM server, backed by the real local engine.

It speaks the wire formats remote verification uses (see
``gateway/endpoints/remote/wire.py``): SGLang's ``/generate`` (token ids in, top
logprobs of the input from ``logprob_start_len``, streamed or not), vLLM's token-in
``/inference/v1/generate`` (``prompt_logprobs`` with ``rank``), both servers' ``/tokenize``,
and the OpenAI ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` that
pass-through requests reach.

Decoding (every generate request with no logprobs asked, and the OpenAI routes) is the
engine's own greedy decoding, without drafts. Scoring is a batch-1 forward of the model
over the tokens not already in a one-sequence prefix cache (like SGLang's radix cache);
the engine's steps and these forwards are the same arithmetic, which the gateway's
self-test then measures rather than assumes. ``fail_scores_after``, ``gone_after_scores``,
``fail_all``, ``perturb_every`` and ``tie_every`` inject the failures, the disagreement and
the near ties the tests need.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats
from local_verifier.sampling import SamplingParams
from local_verifier.testing.kv_cache import forward, new_cache


class _Scorer:
    """Logits of given tokens with a one-sequence prefix cache (the last request's ids)."""

    def __init__(self, engine: Engine, max_len: int = 2048) -> None:
        self.engine = engine
        self.cache = new_cache(engine.lm, max_len)
        self.ids: list[int] = []
        self.lock = threading.Lock()

    def logprobs(self, ids: list[int], start: int | None) -> tuple[torch.Tensor, int, int]:
        """(log-softmax rows for positions ``first..len(ids) - 1``, ``first``, cached tokens):
        ``first`` is ``start``, or with ``None`` the first position not in the cache."""
        with self.lock, torch.no_grad():
            if not self.engine.wait_idle(60):  # the model's steps never overlap
                raise RuntimeError("the engine did not go idle")
            same = 0
            for a, b in zip(self.ids, ids, strict=False):
                if a != b:
                    break
                same += 1
            reuse = min(same, len(ids) - 1, self.cache.length)
            if start is not None:
                reuse = min(reuse, start)
            first = reuse if start is None else start
            self.cache.truncate(reuse)
            logits = forward(self.engine.lm.model, torch.tensor(ids[reuse:]), self.cache)
            self.ids = list(ids)
            return torch.log_softmax(logits[first - reuse :].float(), dim=-1), first, reuse


class RemoteStandIn:
    """The stand-in's state and Starlette app (``app``); counters for the tests."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # one prefix cache per API, as if each were a server of its own
        self.scorers = {"sglang": _Scorer(engine), "vllm": _Scorer(engine)}
        self.fail_scores_after: int | None = None  # scoring answers 503 after this many
        self.gone_after_scores: int | None = None  # every route 503s after this many scores
        self.fail_all = False  # every route answers 503 (the server is gone)
        self.perturb_every = 0  # >0: every k-th scored position's top-1 is replaced
        self.tie_every = 0  # >0: every k-th scored position's top-2 ties its top-1
        self.scores = 0
        self.decodes = 0
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
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/completions", self._openai, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def reset(self) -> None:
        self.fail_scores_after = None
        self.gone_after_scores = None
        self.fail_all = False
        self.perturb_every = 0
        self.tie_every = 0
        self.scores = 0
        self.decodes = 0

    async def _on_scorer_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    # -- the engine ------------------------------------------------------------------------

    async def _generate(self, gen: GenerationRequest) -> AsyncIterator[Any]:
        """The engine's items (``TextDelta`` then ``GenerationStats``) for ``gen``."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        async with self.busy:
            handle = self.engine.submit(
                gen, lambda item: loop.call_soon_threadsafe(items.put_nowait, item)
            )
            try:
                while (item := await items.get()) is not END:
                    if isinstance(item, Exception):
                        raise item
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
        self, api: str, ids: list[int], start: int | None, k: int
    ) -> tuple[Any, int, int]:
        """Top-``k`` (values, ids) per position from ``first`` on, ``first``, cached tokens."""
        self.scores += 1
        if self.gone_after_scores is not None and self.scores > self.gone_after_scores:
            self.fail_all = True
        if self.fail_all or (
            self.fail_scores_after is not None and self.scores > self.fail_scores_after
        ):
            raise _Unavailable
        async with self.busy:
            rows, first, cached = await self._on_scorer_thread(
                self.scorers[api].logprobs, ids, start
            )
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

    # -- SGLang ----------------------------------------------------------------------------

    async def _sglang_generate(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await request.json()
        ids = [int(t) for t in body["input_ids"]]
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        rid = uuid.uuid4().hex
        if body.get("return_logprob"):
            start = int(body.get("logprob_start_len", -1))
            start = len(ids) - 1 if start < 0 else start
            try:
                top_k = int(body.get("top_logprobs_num", 0))
                rows, _, cached = await self._score("sglang", ids, start, top_k)
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
            return JSONResponse({"text": "", "output_ids": [next_id], "meta_info": meta})

        async def events() -> AsyncIterator[bytes]:
            out: list[int] = []
            async for new in self._greedy_ids("sglang", ids, max_new):
                out += new
                meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out)}
                event = {"text": "", "output_ids": list(out), "meta_info": meta}
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        out = [t async for new in self._greedy_ids("sglang", ids, max_new) for t in new]
        meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out)}
        return JSONResponse({"text": "", "output_ids": out, "meta_info": meta})

    # -- vLLM ------------------------------------------------------------------------------

    async def _vllm_generate(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await request.json()
        ids = [int(t) for t in body["token_ids"]]
        params = body.get("sampling_params") or {}
        max_tokens = int(params.get("max_tokens", 16))
        rid = f"generate-tokens-{uuid.uuid4().hex}"
        k = params.get("prompt_logprobs")
        if k is not None:
            try:
                skip = params.get("skip_reading_prefix_cache")
                start = 0 if skip or skip is None else None  # vLLM's default: skip
                rows, first, cached = await self._score("vllm", ids, start, max(int(k), 1))
            except _Unavailable:
                return _unavailable()
            # positions read from the prefix cache have no logprobs
            prompt_logprobs: list[Any] = [None] * (first + 1)
            for pos in range(first + 1, len(ids)):
                values, indices = rows[pos - 1 - first]
                entry = {
                    str(i): {"logprob": v, "rank": r + 1, "decoded_token": None}
                    for r, (v, i) in enumerate(zip(values, indices, strict=True))
                }
                if str(ids[pos]) not in entry:
                    entry[str(ids[pos])] = {
                        "logprob": -9999.0,
                        "rank": k + 1,
                        "decoded_token": None,
                    }
                prompt_logprobs.append(entry)
            values, indices = rows[-1]
            after = [
                {"token": f"token_id:{i}", "logprob": v, "bytes": None, "top_logprobs": []}
                for v, i in zip(values, indices, strict=True)
            ]
            choice = {
                "index": 0,
                "logprobs": {
                    "content": [
                        {
                            "token": f"token_id:{indices[0]}",
                            "logprob": values[0],
                            "bytes": None,
                            "top_logprobs": after,
                        }
                    ]
                },
                "finish_reason": "length",
                "token_ids": [indices[0]],
            }
            usage = {
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "total_tokens": len(ids) + 1,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            return JSONResponse(
                {
                    "request_id": rid,
                    "choices": [choice],
                    "prompt_logprobs": prompt_logprobs,
                    "usage": usage,
                    "kv_transfer_params": None,
                }
            )

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
            return StreamingResponse(events(), media_type="text/event-stream")
        out = [t async for new in self._greedy_ids("vllm", ids, max_tokens) for t in new]
        choice = {"index": 0, "logprobs": None, "finish_reason": "stop", "token_ids": out}
        return JSONResponse({"request_id": rid, "choices": [choice], "prompt_logprobs": None})

    async def _tokenize(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await request.json()
        tokenizer = self.engine.tokenizer
        tokens = tokenizer.encode(body["prompt"], bool(body.get("add_special_tokens", True)))
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    # -- OpenAI (pass-through) -------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "smollm2", "object": "model"}]})

    async def _openai(self, request: Request) -> Response:
        if self.fail_all:
            return _unavailable()
        body = await request.json()
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


def _unavailable() -> Response:
    return JSONResponse({"error": {"message": "the server is unavailable"}}, status_code=503)
