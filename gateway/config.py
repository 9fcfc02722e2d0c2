"""Gateway configuration: a TOML file (``draftgate.toml``) plus environment overrides.

``load_settings(path)`` reads the file, applies the environment and validates everything
with pydantic; a bad file raises :class:`ConfigError` whose message names the field.
Environment: ``DRAFTGATE_<FIELD>`` for top-level fields (``DRAFTGATE_CAPTURE=1``,
``DRAFTGATE_MAX_BODY_BYTES``, nested with ``__``), and ``DRAFTGATE_REDIS_URL`` or
``REDIS_URL`` for the Redis URL.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from gateway.provider_table import PROVIDERS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _known_kind(kind: str) -> str:
    """``kind`` when the provider table has a row for it (read at validation time)."""
    if kind not in PROVIDERS:
        *first, last = (repr(k) for k in PROVIDERS)
        expected = f"{', '.join(first)} or {last}"
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )
    return kind


EndpointKind = Annotated[
    str,
    AfterValidator(_known_kind),
    WithJsonSchema({"type": "string", "enum": list(PROVIDERS)}),
]
RoutingStrategy = Literal["least-busy", "prefix", "ordered"]
RemoteVerify = Literal["off", "remote", "remote-approximate", "in-engine"]

DEFAULT_LOCAL_MODEL = "smollm2-135m"
DEFAULT_MAX_TOKENS_CAP = 4096  # an answer's bound where the gateway makes its tokens
DEFAULT_CONFIG_FILE = "draftgate.toml"


class ConfigError(Exception):
    """The configuration cannot be used; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelEntry(_Strict):
    """A model an endpoint serves: the name clients send, optional aliases, and the
    provider's own name for it (``upstream``; for Azure the deployment) when different."""

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    upstream: str | None = None

    @property
    def upstream_name(self) -> str:
        return self.upstream or self.name


class EndpointConfig(_Strict):
    """One upstream endpoint (hosted provider, self-hosted engine, or the local target)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    kind: EndpointKind
    base_url: str | None = None
    api_key_env: str | None = None
    models: tuple[ModelEntry, ...] = ()
    model: str | None = Field(default=None, description="local kind: path or alias of the target")
    device: str | None = None
    dtype: str | None = None
    api_version: str | None = Field(default=None, description="azure: the api-version query")
    deployment: str | None = Field(default=None, description="azure: one deployment for all models")
    accepts_prediction: bool | None = Field(
        default=None, description="override the built-in capability table for this endpoint"
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=600.0, gt=0, description="read timeout per chunk")
    retries: int = Field(default=2, ge=0, le=10)
    backoff_s: float = Field(default=0.25, ge=0)
    max_backoff_s: float = Field(default=4.0, ge=0)
    retry_after_cap_s: float = Field(default=10.0, ge=0)
    max_connections: int = Field(default=256, ge=1)
    max_batch: int | None = Field(
        default=None,
        ge=1,
        description="local kind: requests running at once (None: the engine's default, 16)",
    )
    max_queue: int = Field(default=64, ge=1, description="local kind: waiting requests")
    tenant_places: int | None = Field(
        default=None,
        ge=1,
        description="local kind: one tenant's requests running and waiting (None: half of "
        "max_batch + max_queue); a tenant past it gets 429s while others are served",
    )
    prefix_cache: bool = Field(
        default=True,
        description="local kind: reuse computed prompt prefixes (K/V and the drafter's index)",
    )
    share_prefix_cache: bool = Field(
        default=False,
        description="local kind: reuse computed prefixes across tenants; a tenant can then "
        "tell from its answers' timing and cached_tokens whether another tenant sent a "
        "guessed prompt prefix",
    )
    kv_cache_mb: float | None = Field(
        default=None,
        gt=0,
        description=(
            "local kind: KV pool size in MiB, which also bounds the context a request can "
            "use (None: the engine's default, 512)"
        ),
    )
    max_tokens_cap: int | None = Field(
        default=None,
        ge=1,
        description="the most tokens one answer may generate: a request asking more is "
        "clamped to it (None: 4096 on the local kind and remote verification, no cap on "
        "other endpoints)",
    )
    max_tokens_default: int | None = Field(
        default=None,
        ge=1,
        description="local kind and verify: an answer's max_tokens when absent (the cap)",
    )
    messages_temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Messages API (POST /v1/messages): the temperature of a request that sends "
        "none, when this is the model's first endpoint (None: Anthropic's default, 1.0)",
    )
    health_check: bool | None = Field(
        default=None,
        description="active GET {base_url}/models checks (default: on unless a hosted provider)",
    )
    verify: RemoteVerify = Field(
        default="off",
        description="sglang/vllm kinds: verify drafts over the engine's own API once the "
        "self-test finds it exact (`remote-approximate`: also when only approximate); "
        "`in-engine` (vllm): send the drafts with each request for vLLM's own speculation "
        "to verify (the draftgate-vllm plugin in the server)",
    )
    tokenizer: str | None = Field(
        default=None,
        description="verify: the served model's tokenizer (a .gguf file, a tokenizer.json or "
        "its Hugging Face directory, or the smollm2-135m alias)",
    )
    verify_check_interval_s: float = Field(
        default=600.0, ge=0, description="verify: how often the self-test reruns (0 = start only)"
    )
    verify_round_trip_s: float | None = Field(
        default=None,
        gt=0,
        description="verify: a scoring round trip's cost, pinned (None: measured)",
    )
    verify_token_s: float | None = Field(
        default=None,
        gt=0,
        description="verify: the engine's time per output token, pinned (None: measured)",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _model_entries(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return tuple({"name": v} if isinstance(v, str) else v for v in value)
        return value

    @model_validator(mode="after")
    def _kind_needs(self) -> EndpointConfig:
        provider = PROVIDERS[self.kind]
        if provider.in_process:
            if self.model is None and self.base_url is None:
                raise ValueError(
                    f"a {self.kind} endpoint needs `model` (path or alias of the target)"
                )
            if not self.models:
                object.__setattr__(self, "models", (ModelEntry(name=self.model or self.name),))
        elif self.base_url is None:
            if provider.base_url is None:
                raise ValueError(f"endpoint kind {self.kind!r} needs `base_url`")
            object.__setattr__(self, "base_url", provider.base_url)
        if self.max_tokens_cap is None and self.makes_tokens:
            object.__setattr__(self, "max_tokens_cap", DEFAULT_MAX_TOKENS_CAP)
        cap = self.max_tokens_cap
        if cap is not None and (self.max_tokens_default or 0) > cap:
            raise ValueError("`max_tokens_default` must not exceed `max_tokens_cap`")
        if self.verify != "off":
            if not provider.verify:
                kinds = " or ".join(k for k, p in PROVIDERS.items() if p.verify)
                raise ValueError(f"`verify` needs an endpoint of kind {kinds}")
            if not self.tokenizer:
                raise ValueError("`verify` needs `tokenizer` (the served model's tokenizer)")
            if self.verify == "in-engine" and self.kind != "vllm":
                raise ValueError('`verify = "in-engine"` needs an endpoint of kind vllm')
        for name in provider.needs:
            if not getattr(self, name):
                raise ValueError(f"an endpoint of kind {self.kind!r} needs `{name}`")
        if not self.models:
            raise ValueError("`models` must list at least one model name")
        names = self.client_names()
        if len(names) != len(set(names)):
            raise ValueError("`models`: a model name or alias appears twice")
        return self

    @property
    def makes_tokens(self) -> bool:
        """Whether the gateway makes the answers' tokens (local kinds, remote verification):
        an answer then always has a bound, the cap by default."""
        return PROVIDERS[self.kind].in_process or self.verify in ("remote", "remote-approximate")

    def answer_tokens(self, requested: int | None) -> int:
        """The most tokens one answer may generate here: ``requested`` (or the default when
        absent) within the cap, on local endpoints and remotely verified ones; another
        remote endpoint (``in-engine`` included) clamps ``requested`` to its cap when it
        has one, and bounds nothing when nothing is requested (0)."""
        cap = self.max_tokens_cap
        if not self.makes_tokens:
            return min(requested, cap) if requested and cap is not None else requested or 0
        assert cap is not None  # set by validation
        return min(requested or self.max_tokens_default or cap, cap)

    def client_names(self) -> list[str]:
        """Every name clients may send for this endpoint (names and aliases)."""
        return [n for m in self.models for n in (m.name, *m.aliases)]

    @property
    def actively_checked(self) -> bool:
        """Whether the periodic health check asks this endpoint (never an in-process one)."""
        if self.base_url is None:
            return False
        if self.health_check is not None:
            return self.health_check
        return not PROVIDERS[self.kind].hosted

    def upstream_model(self, client_name: str) -> str:
        """The provider's model name for a name clients send."""
        for m in self.models:
            if client_name == m.name or client_name in m.aliases:
                return m.upstream_name
        raise KeyError(client_name)


class KeyConfig(_Strict):
    """A gateway API key (read from ``key_env``) and the tenant it maps to."""

    key_env: str = Field(min_length=1)
    tenant: str = Field(min_length=1)
    admin: bool = Field(default=False, description="may run audits and probes")
    weight: float = Field(
        default=1.0, gt=0, description="the tenant's share of a local engine, relative to others"
    )


class RedisConfig(_Strict):
    url: str | None = None
    prefix: str = "dg:"
    timeout_s: float = Field(default=0.05, gt=0)


class DocumentsConfig(_Strict):
    ttl_s: int = Field(default=86400, ge=1)
    recent: int = Field(default=2, ge=0, description="recent captured answers to draft from")
    max_ids: int = Field(default=64, ge=1, description="document ids one request may name")


class ResponsesConfig(_Strict):
    """Responses stored by ``POST /v1/responses`` (in Redis when configured), per tenant."""

    ttl_s: int = Field(default=86400, ge=1, description="seconds a stored response is kept")
    max_responses: int = Field(
        default=1000, ge=1, description="responses one tenant keeps; the oldest go first"
    )
    max_bytes: int = Field(
        default=64 << 20,
        ge=1024,
        description="bytes one tenant keeps (responses with their input items as JSON)",
    )


class LimitsConfig(_Strict):
    """Per-tenant limits (429 with ``Retry-After`` past them); in Redis when configured."""

    concurrent: int = Field(default=32, ge=1, description="requests in flight")
    requests_per_minute: int = Field(default=1200, ge=1)
    tokens_per_minute: int = Field(
        default=4_000_000, ge=1, description="prompt bytes / 4 + n x max_tokens, at admission"
    )
    uploads_per_minute: int = Field(default=3000, ge=1, description="POST /v1/documents")
    unauthenticated_per_minute: int = Field(
        default=120,
        ge=1,
        description="requests without a valid key from one client address (an IPv6 /64) "
        "answered 401; past it 429",
    )
    over_limit_hold_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="the door's 429s (a client address past unauthenticated_per_minute, a "
        "tenant whose limit this gateway knows is spent) are answered after "
        "min(Retry-After, this), costing no CPU meanwhile; 0: at once",
    )
    over_limit_max_held: int = Field(
        default=1024,
        ge=1,
        description="429s held at once; past it one is answered at once with Connection: close",
    )


class ServerConfig(_Strict):
    """How ``draftgate serve`` runs uvicorn."""

    limit_concurrency: int = Field(
        default=1024, ge=1, description="connections and requests at once; more get a 503"
    )
    keep_alive_s: int = Field(default=5, ge=1, description="an idle connection is closed after")
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a request's headers must arrive within this"
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request's body must arrive within this (408)"
    )


class RoutingConfig(_Strict):
    """How a model's endpoints share its traffic, and when a failing one is taken out.

    ``least-busy`` (the default) picks the endpoint with the fewest requests in flight,
    weighted by a moving average of its latency; ``prefix`` sends requests that share a
    session (``X-Draftgate-Session``) or the first ``prefix_chars`` characters of the
    prompt to the same endpoint (rendezvous hashing), unless that endpoint already holds
    more than ``load_factor`` times its share of the requests in flight; ``ordered``
    tries them in configuration order. Models listed in ``[fallback]`` keep that order.
    """

    strategy: RoutingStrategy = "least-busy"
    prefix_chars: int = Field(default=512, ge=1)
    load_factor: float = Field(default=1.5, ge=1.0)
    failures: int = Field(default=3, ge=1, description="failures within window_s that eject")
    window_s: float = Field(default=10.0, gt=0)
    eject_s: float = Field(default=5.0, gt=0, description="first back-off; doubles per ejection")
    max_eject_s: float = Field(default=60.0, gt=0)
    health_check_interval_s: float = Field(
        default=10.0, ge=0, description="active checks of self-hosted endpoints; 0 = off"
    )


def _default_endpoints() -> tuple[EndpointConfig, ...]:
    return (
        EndpointConfig(
            name="local",
            kind="local",
            model=DEFAULT_LOCAL_MODEL,
            models=(ModelEntry(name=DEFAULT_LOCAL_MODEL, aliases=("smollm2",)),),
        ),
    )


class Settings(BaseSettings):
    """Everything the gateway needs at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="DRAFTGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    endpoints: tuple[EndpointConfig, ...] = Field(default_factory=_default_endpoints)
    fallback: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="model name -> endpoint names, in the order tried"
    )
    keys: tuple[KeyConfig, ...] = ()
    redis: RedisConfig = RedisConfig()
    documents: DocumentsConfig = DocumentsConfig()
    responses: ResponsesConfig = ResponsesConfig()
    limits: LimitsConfig = LimitsConfig()
    server: ServerConfig = ServerConfig()
    routing: RoutingConfig = RoutingConfig()
    capture: bool = False
    audit_dir: Path | None = Field(
        default=None,
        description="audit reports: draftgate audit (without --out) and the dashboard's audits "
        "write a folder per run here; the dashboard lists them all",
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="an upstream's non-streamed answer"
    )
    allow_public_bind: bool = False
    auth: bool = Field(default=True, description="false: no keys checked (the verifier server)")
    metrics_public: bool = Field(
        default=False,
        description="true: /metrics, /v1/endpoints and endpoint memory open to every tenant "
        "(/metrics without a key); false: with keys configured, admin keys only",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # the environment overrides the file (the file's content arrives as init kwargs)
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        names = [e.name for e in self.endpoints]
        if len(names) != len(set(names)):
            raise ValueError("endpoints: two endpoints share a name")
        if not self.endpoints:
            raise ValueError("endpoints: at least one endpoint is needed")
        by_name = {e.name: e for e in self.endpoints}
        for model, order in self.fallback.items():
            for endpoint in order:
                if endpoint not in by_name:
                    raise ValueError(f"fallback.{model}: no endpoint named {endpoint!r}")
                if model not in by_name[endpoint].client_names():
                    raise ValueError(f"fallback.{model}: endpoint {endpoint!r} does not serve it")
        tenants = [k.key_env for k in self.keys]
        if len(tenants) != len(set(tenants)):
            raise ValueError("keys: a key_env appears twice")
        return self

    def routes(self) -> dict[str, tuple[EndpointConfig, ...]]:
        """Client model name -> the endpoints to try, in order."""
        by_name = {e.name: e for e in self.endpoints}
        table: dict[str, list[EndpointConfig]] = {}
        for endpoint in self.endpoints:
            for name in endpoint.client_names():
                table.setdefault(name, []).append(endpoint)
        for model, order in self.fallback.items():
            table[model] = [by_name[n] for n in order]
        return {k: tuple(v) for k, v in table.items()}


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def build_settings(data: Mapping[str, Any], source: str = "configuration") -> Settings:
    """Validate a mapping (the parsed TOML) plus the environment into :class:`Settings`."""
    try:
        return Settings(**dict(data))
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None
    except SettingsError as err:  # an environment override that is not valid JSON
        raise ConfigError(f"invalid configuration in the environment: {err}") from None


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read ``path`` (or ``./draftgate.toml`` when it exists; else the embedded default).

    ``REDIS_URL`` / ``DRAFTGATE_REDIS_URL`` from ``environ`` (default ``os.environ``) set
    the Redis URL.
    """
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    source = str(path) if path is not None else "defaults"
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file not found: {path}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"invalid TOML in {path}: {err}") from None
    redis_url = env.get("DRAFTGATE_REDIS_URL") or env.get("REDIS_URL")
    if redis_url:
        redis = dict(data.get("redis") or {})
        redis["url"] = redis_url
        data["redis"] = redis
    return build_settings(data, source)
