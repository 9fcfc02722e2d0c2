"""Stand-in engines for probes: real vLLM metric text (rendered by prometheus_client with
vLLM's metric names, as vLLM itself renders it), SGLang ``/server_info`` and ``/metrics``,
and the tests' OpenAI stand-in, silently ignoring ``prediction`` as vLLM does."""

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
    """vLLM's ``/metrics``; spec-decode counters exist only when ``speculative``.

    ``prefix_caching``: ``vllm:cache_config_info``'s ``enable_prefix_caching`` label and the
    V1 prefix-cache counters (None: neither is shown). ``v0_hit_rate``: the V0 gauge instead.
    """

    speculative: bool
    prefix_caching: bool | None = None
    v0_hit_rate: float | None = None
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
        if self.prefix_caching is not None:
            Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                ("block_size", "enable_prefix_caching", "engine"),
                registry=self.registry,
            ).labels("16", str(self.prefix_caching), "0").set(1)
            self.queries = Counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                labels,
                registry=self.registry,
            ).labels("m", "0")
            self.hits = Counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                labels,
                registry=self.registry,
            ).labels("m", "0")
        if self.v0_hit_rate is not None:
            Gauge(
                "vllm:gpu_prefix_cache_hit_rate",
                "GPU prefix cache block hit rate.",
                ("model_name",),
                registry=self.registry,
            ).labels("m").set(self.v0_hit_rate)
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


def sglang_app(
    algorithm: str | None, radix_cache: bool | None = None, hit_rate: float | None = None
) -> Starlette:
    """SGLang's ``/server_info`` (``disable_radix_cache`` unless ``radix_cache`` is None) and,
    when ``hit_rate`` is given, ``/metrics`` with ``sglang:cache_hit_rate`` (else a 404, as
    without ``--enable-metrics``)."""
    registry = CollectorRegistry()
    if hit_rate is not None:
        Gauge(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate.",
            ("model_name",),
            registry=registry,
        ).labels("m").set(hit_rate)

    async def server_info(request: Request) -> Response:
        info: dict[str, object] = {
            "model_path": "m",
            "speculative_algorithm": algorithm,
            "speculative_num_steps": 3 if algorithm else None,
        }
        if radix_cache is not None:
            info["disable_radix_cache"] = not radix_cache
        return JSONResponse(info)

    async def metrics(request: Request) -> Response:
        if hit_rate is None:
            return Response("Not Found", status_code=404)
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return Starlette(routes=[Route("/server_info", server_info), Route("/metrics", metrics)])
