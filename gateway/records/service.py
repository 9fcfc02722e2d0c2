"""Speculation records: documented row + evidence + verdict + passive latency, per endpoint
(and whether the engine caches prefixes, with its evidence)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from gateway.provider_table import PROVIDERS
from gateway.records.evidence import verdict
from gateway.records.probes import probe_engine, probe_usage
from gateway.records.store import RecordStore
from gateway.records.table import documented_for
from gateway.records.traffic import latency
from sdk.wire.endpoints import EndpointRecord
from sdk.wire.evidence import Evidence


class EndpointLike(Protocol):
    """What records need of an endpoint's configuration (``gateway.config.EndpointConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def models(self) -> Any: ...


def model_names(endpoint: EndpointLike) -> list[str]:
    """The client-facing model names of an endpoint (config entries or plain strings)."""
    return [m if isinstance(m, str) else m.name for m in endpoint.models]


def remote_verify_state(verify: str, evidence: Sequence[Evidence]) -> tuple[Any, float | None]:
    """(state, agreement) of remote verification from the newest self-test evidence: its
    ``detail`` starts with the state (``exact``/``approximate``; anything else failed);
    ``in-engine``: the engine speculates by itself with the gateway's drafts."""
    if verify in ("off", "in-engine"):
        return verify, None
    tests = [ev for ev in evidence if ev.feature == "remote_verify"]
    if not tests:
        return "unknown", None
    newest = max(tests, key=lambda ev: ev.observed_at)
    state = newest.detail.split(":", 1)[0]
    if state not in ("exact", "approximate"):
        state = "failed"
    return state, newest.values.get("agreement")


class Records:
    """Builds records from the table and the store; runs probes on demand."""

    def __init__(self, endpoints: Sequence[EndpointLike], store: RecordStore) -> None:
        self.endpoints = {e.name: e for e in endpoints}
        self.store = store
        self._probing: set[str] = set()

    async def add_evidence(self, endpoint: str, evidence: Evidence) -> None:
        await self.store.add_evidence(endpoint, evidence)

    async def record(self, name: str) -> EndpointRecord:
        """The record of one configured endpoint (``KeyError`` for an unknown name)."""
        e = self.endpoints[name]
        models = model_names(e)
        evidence = await self.store.evidence(name)
        enabled, basis = verdict(evidence)
        prefix_cache, prefix_basis = verdict(evidence, "prefix_cache")
        remote, agreement = remote_verify_state(getattr(e, "verify", "off"), evidence)
        return EndpointRecord(
            name=name,
            kind=e.kind,
            models=models,
            documented=documented_for(e.kind, models),
            enabled=enabled,
            enabled_evidence=basis,
            prefix_cache=prefix_cache,
            prefix_cache_evidence=prefix_basis,
            remote_verify=remote,
            remote_verify_agreement=agreement,
            evidence=sorted(evidence, key=lambda ev: ev.observed_at, reverse=True),
            latency=await latency(self.store, name),
        )

    async def records(self) -> list[EndpointRecord]:
        return [await self.record(name) for name in self.endpoints]

    def busy(self, names: Sequence[str]) -> list[str]:
        """The endpoints among ``names`` being probed now."""
        return [n for n in names if n in self._probing]

    async def probe(
        self, gateway: httpx.AsyncClient, headers: Mapping[str, str], timeout_s: float = 300.0
    ) -> None:
        """Probe every endpoint and store what was found; one probe run per endpoint at a
        time (call :meth:`busy` first: an endpoint being probed is skipped).

        Engines are asked directly (metrics, server info); the usage probe goes through
        ``gateway`` (a client of this gateway, e.g. in process: never a URL a request
        named) so credentials, model names and draft handling are the gateway's own, and
        it asks the endpoint's first model.
        """
        endpoints = [e for e in self.endpoints.values() if e.name not in self._probing]
        self._probing.update(e.name for e in endpoints)
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                await asyncio.gather(
                    *(self._probe_one(client, gateway, e, headers) for e in endpoints)
                )
        finally:
            self._probing.difference_update(e.name for e in endpoints)

    async def _probe_one(
        self,
        client: httpx.AsyncClient,
        gateway: httpx.AsyncClient,
        e: EndpointLike,
        headers: Mapping[str, str],
    ) -> None:
        models = model_names(e)
        found: list[Evidence] = []
        if PROVIDERS[e.kind].engine and e.base_url:
            previous = next(
                (
                    ev
                    for ev in await self.store.evidence(e.name)
                    if ev.kind == "probe" and ev.values and ev.feature == "speculation"
                ),
                None,
            )
            found += await probe_engine(client, e.kind, e.base_url, models[0], previous)
        documented = documented_for(e.kind, models)
        if documented is None or documented.accepts_prediction != "no":
            found.append(
                await probe_usage(gateway, "/v1/chat/completions", models[0], headers, e.name)
            )
        for ev in found:
            await self.add_evidence(e.name, ev)
