"""``verify = "in-engine"``: the gateway sends its drafts to vLLM as token ids in
``vllm_xargs`` and relays the engine's answer unchanged, against the stand-in vLLM (which
checks ``vllm_xargs`` as vLLM types it) backed by the real SmolLM2 engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from draftgate_vllm import drafts as plugin

from gateway.app import create_app
from gateway.config import ConfigError, build_settings
from gateway.endpoints import in_engine
from gateway.endpoints.in_engine import draft_xargs, with_xargs
from tests.gateway.servers import serve
from tests.remote_standin import RemoteStandIn

MODEL = "smollm2-vl"
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
MESSAGES = [{"role": "user", "content": f"Rename `add` to `plus`:\n```python\n{CODE}```"}]
PREDICTION = "```python\n" + CODE.replace("add", "plus") + "```"
DOCUMENT = "def mul(a, b):\n    return a * b\n"


def _endpoint(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "vl",
        "kind": "vllm",
        "base_url": f"{url}/v1",
        "models": [MODEL],
        "verify": "in-engine",
        "tokenizer": "smollm2-135m",
        "retries": 0,
        **extra,
    }


@pytest.fixture(scope="module")
def standin(engine: Any) -> Iterator[tuple[RemoteStandIn, str]]:
    server = RemoteStandIn(engine)
    with serve(server.app) as url:
        yield server, url


@pytest.fixture(scope="module")
def gateway(standin: tuple[RemoteStandIn, str]) -> Iterator[str]:
    settings = build_settings({"auth": False, "endpoints": [_endpoint(standin[1])]}, "test")
    with serve(create_app(settings, environ={})) as url:
        yield url


@pytest.fixture
def fresh(standin: tuple[RemoteStandIn, str]) -> RemoteStandIn:
    standin[0].reset()
    return standin[0]


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 24, **extra}


def _tokens(url: str, text: str) -> list[int]:
    answer = httpx.post(f"{url}/tokenize", json={"prompt": text, "add_special_tokens": False})
    return list(answer.json()["tokens"])


def _engines_own(url: str) -> str:
    """The stand-in's answer asked directly, with no drafts."""
    body = {**_body(), "model": "smollm2"}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    return str(answer["choices"][0]["message"]["content"])


def test_the_prediction_goes_as_token_ids_and_the_answer_comes_back_unchanged(
    standin: tuple[RemoteStandIn, str], gateway: str, fresh: RemoteStandIn
) -> None:
    own = _engines_own(standin[1])
    body = _body(prediction={"type": "content", "content": PREDICTION})
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200
    assert response.headers["x-draftgate-prediction"] == "verified-in-engine"
    assert response.json()["choices"][0]["message"]["content"] == own
    sent = fresh.xargs[-1]
    assert sent == {plugin.PREDICTION_KEY: _tokens(standin[1], PREDICTION)}
    assert "x-draftgate-remote-verify" not in response.headers


def test_a_stream_carries_the_drafts_and_relays_the_engines_events(
    standin: tuple[RemoteStandIn, str], gateway: str, fresh: RemoteStandIn
) -> None:
    own = _engines_own(standin[1])
    body = _body(prediction={"type": "content", "content": PREDICTION}, stream=True)
    texts = []
    with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.headers["x-draftgate-prediction"] == "verified-in-engine"
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                texts.append(delta.get("content") or "")
    assert "".join(texts) == own
    assert fresh.xargs[-1] == {plugin.PREDICTION_KEY: _tokens(standin[1], PREDICTION)}


def test_named_documents_go_after_the_prediction_and_the_clients_xargs_stay(
    standin: tuple[RemoteStandIn, str], gateway: str, fresh: RemoteStandIn
) -> None:
    created = httpx.post(f"{gateway}/v1/documents", json={"id": "ops.py", "text": DOCUMENT})
    assert created.status_code == 201
    body = _body(
        draftgate={"documents": ["ops.py"]},
        vllm_xargs={"client": "kept", plugin.DOCUMENTS_KEY: [1, 2, 3]},
    )
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200
    assert response.headers["x-draftgate-prediction"] == "verified-in-engine"
    sent = fresh.xargs[-1]
    documents = sent[plugin.DOCUMENTS_KEY]
    assert sent["client"] == "kept" and plugin.PREDICTION_KEY not in sent
    assert documents[: documents.index(plugin.SEPARATOR) + 1] == [
        *_tokens(standin[1], DOCUMENT),
        plugin.SEPARATOR,
    ]


def test_drafting_turned_off_sends_no_drafts(gateway: str, fresh: RemoteStandIn) -> None:
    body = _body(prediction={"type": "content", "content": PREDICTION}, draftgate={"draft": False})
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200
    assert response.headers["x-draftgate-prediction"] != "verified-in-engine"
    assert fresh.xargs == [None]


def test_the_endpoint_is_recorded_as_speculating_by_itself(gateway: str) -> None:
    records = httpx.get(f"{gateway}/v1/endpoints", timeout=30).json()["data"]
    assert [(r["name"], r["remote_verify"]) for r in records] == [("vl", "in-engine")]


def test_in_engine_needs_a_vllm_endpoint() -> None:
    endpoint = {**_endpoint("http://127.0.0.1:9"), "kind": "sglang"}
    with pytest.raises(ConfigError, match="in-engine"):
        build_settings({"endpoints": [endpoint]}, "test")


def test_the_wire_keys_are_the_plugins() -> None:
    assert (in_engine.PREDICTION_KEY, in_engine.DOCUMENTS_KEY, in_engine.SEPARATOR) == (
        plugin.PREDICTION_KEY,
        plugin.DOCUMENTS_KEY,
        plugin.SEPARATOR,
    )


def test_drafts_are_bounded_and_spliced_into_any_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(in_engine, "MAX_DRAFT_TOKENS", 6)
    assert draft_xargs([1, 2, 3], [[4, 5, 6, 7], [8]]) == {
        in_engine.PREDICTION_KEY: [1, 2, 3],
        in_engine.DOCUMENTS_KEY: [4, 5, -1],
    }
    xargs = {in_engine.PREDICTION_KEY: [1]}
    assert json.loads(with_xargs(b'{"model":"m"} ', xargs)) == {"model": "m", "vllm_xargs": xargs}
    assert json.loads(with_xargs(b"{}", xargs)) == {"vllm_xargs": xargs}
    both = with_xargs(b'{"vllm_xargs":{"a":1,"draftgate_prediction":[9]}}', xargs)
    assert json.loads(both) == {"vllm_xargs": {"a": 1, in_engine.PREDICTION_KEY: [1]}}
