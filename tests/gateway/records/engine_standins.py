"""Stand-in engines for probes: real vLLM metric text (rendered by prometheus_client with
vLLM's metric names, as vLLM itself renders it), SGLang ``/server_info``, and the tests' OpenAI stand-in, silently
ignoring ``prediction`` as vLLM does."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from tests.openai_standin import Script, StandIn


@dataclass
class VllmStandin:
    """vLLM's ``/metrics``; spec-decode counters exist only when ``speculative``."""

    speculative: bool
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # the OpenAI-compatible routes: like vLLM, it accepts `prediction`, ignores it, answers 200
    openai: StandIn = field(default_factory=lambda: StandIn(Script(speculative=False)))

    def __post_init__(self) -> None:
        labels = ("model_name", "engine")
        Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=self.registry,
        ).labels("m", "0").set(0)
        Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=self.registry,
        ).labels("m", "0").inc(120)
        if self.speculative:
            self.drafts = Counter(
                "vllm:spec_decode_num_drafts",
                "Number of spec decoding drafts.",
                labels,
                registry=self.registry,
            ).labels("m", "0")
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens",
                "Number of draft tokens.",
                labels,
                registry=self.registry,
            ).labels("m", "0")
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                labels,
                registry=self.registry,
            ).labels("m", "0")
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                (*labels, "position"),
                registry=self.registry,
            )
            self.serve(drafts=10, draft_tokens=40, accepted=25)

    def serve(self, drafts: int, draft_tokens: int, accepted: int) -> None:
        """Traffic through the engine: counters rise."""
        self.drafts.inc(drafts)
        self.draft_tokens.inc(draft_tokens)
        self.accepted.inc(accepted)
        self.per_pos.labels("m", "0", "0").inc(accepted)

    def app(self) -> Starlette:
        async def metrics(request: Request) -> Response:
            return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")

        return Starlette(
            routes=[
                Route("/metrics", metrics),
                Mount("/", app=self.openai),
            ]
        )


def sglang_app(algorithm: str | None) -> Starlette:
    async def server_info(request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": "m",
                "speculative_algorithm": algorithm,
                "speculative_num_steps": 3 if algorithm else None,
            }
        )

    return Starlette(routes=[Route("/server_info", server_info)])
