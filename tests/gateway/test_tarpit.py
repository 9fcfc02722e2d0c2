"""The door's 429s are held before they are answered (a tarpit): on a timer, a bounded
number at once (past it, or past a bounded body read while held, answered at once with
``Connection: close``), a client that hangs up while held gets nothing more; other
refusals and keyed requests are never held."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Message

from gateway.app import create_app
from gateway.errors import AuthenticationFailed, GatewayError, RateLimited
from gateway.http.tarpit import HELD_BODY_BYTES, Tarpit
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ALICE = {"authorization": "Bearer alice-key"}
WRONG = {"authorization": "Bearer not-a-key"}


class Timers:
    """A ``call_later`` whose timers fire only when the test says."""

    def __init__(self) -> None:
        self.set: list[tuple[float, Callable[[], None]]] = []
        self.cancelled = 0

    def __call__(self, delay: float, callback: Callable[[], None]) -> Timers:
        self.set.append((delay, callback))
        return self

    def cancel(self) -> None:
        self.cancelled += 1


class Client:
    """One request's ASGI receive and send: the body, then nothing until it hangs up."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()  # the request's body was read; waiting on the client
        self.hang_up = asyncio.Event()
        self.sent: list[Message] = []
        self._body_read = False

    async def receive(self) -> Message:
        if not self._body_read:
            self._body_read = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        self.waiting.set()
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def _over(retry_after: str = "42") -> RateLimited:
    return RateLimited("too many", headers={"retry-after": retry_after})


async def _held(tarpit: Tarpit, client: Client, refusal: GatewayError) -> asyncio.Task[Any]:
    """``tarpit.hold`` running, once it waits on the client."""
    task = asyncio.create_task(tarpit.hold(refusal, client.receive, client.send))
    await client.waiting.wait()
    return task


async def test_an_over_limit_refusal_is_answered_when_its_timer_fires() -> None:
    timers, client = Timers(), Client()
    tarpit = Tarpit(1.0, 4, call_later=timers)
    task = await _held(tarpit, client, _over("42"))
    assert tarpit.held == 1 and not task.done()
    ((delay, fire),) = timers.set
    assert delay == 1.0  # min(Retry-After, hold_s)
    fire()
    assert await task == client.send  # answered through the client's own send
    assert tarpit.held == 0 and timers.cancelled == 1


@pytest.mark.parametrize(
    ("refusal", "hold_s", "delay"),
    [
        (_over("1"), 5.0, 1.0),  # never held past its Retry-After
        (_over("42"), 0.0, 0.0),  # hold_s 0: holding is off
        (AuthenticationFailed("invalid API key"), 1.0, 0.0),  # a 401 is answered at once
        (RateLimited("upstream 429"), 1.0, 0.0),  # a 429 without Retry-After too
    ],
)
async def test_only_a_429_with_retry_after_is_held(
    refusal: GatewayError, hold_s: float, delay: float
) -> None:
    timers, client = Timers(), Client()
    tarpit = Tarpit(hold_s, 4, call_later=timers)
    assert tarpit.delay(refusal) == delay
    if delay == 0:
        assert await tarpit.hold(refusal, client.receive, client.send) == client.send
        assert timers.set == [] and not client.waiting.is_set()


async def test_past_the_bound_a_refusal_is_answered_at_once_with_connection_close() -> None:
    timers, first, second = Timers(), Client(), Client()
    tarpit = Tarpit(1.0, 1, call_later=timers)
    held = await _held(tarpit, first, _over())
    send = await tarpit.hold(_over(), second.receive, second.send)
    assert send is not None and len(timers.set) == 1 and tarpit.held == 1
    await send({"type": "http.response.start", "status": 429, "headers": [(b"a", b"b")]})
    await send({"type": "http.response.body", "body": b"{}"})
    start, body = second.sent
    assert start["headers"] == [(b"a", b"b"), (b"connection", b"close")]
    assert body == {"type": "http.response.body", "body": b"{}"}
    timers.set[0][1]()
    await held


async def test_a_client_that_hangs_up_while_held_gets_nothing_and_frees_its_place() -> None:
    timers, client = Timers(), Client()
    tarpit = Tarpit(1.0, 1, call_later=timers)
    task = await _held(tarpit, client, _over())
    client.hang_up.set()
    assert await task is None  # nothing to answer
    assert tarpit.held == 0 and timers.cancelled == 1 and client.sent == []
    again = await _held(tarpit, Client(), _over())  # its place is free: held, not closed
    assert tarpit.held == 1
    timers.set[1][1]()
    await again


async def test_a_client_sending_a_long_body_while_held_is_answered_at_once_and_closed() -> None:
    timers, chunks = Timers(), 0

    async def receive() -> Message:
        nonlocal chunks
        chunks += 1
        return {"type": "http.request", "body": b"x" * 16384, "more_body": True}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    tarpit = Tarpit(1.0, 1, call_later=timers)
    answer = await tarpit.hold(_over(), receive, send)
    assert answer is not None and chunks == HELD_BODY_BYTES // 16384 + 1
    assert tarpit.held == 0 and timers.cancelled == 1
    await answer({"type": "http.response.start", "status": 429, "headers": []})
    assert sent[0]["headers"] == [(b"connection", b"close")]


async def test_a_held_request_cancelled_from_outside_stays_cancelled() -> None:
    timers, client = Timers(), Client()
    tarpit = Tarpit(1.0, 1, call_later=timers)
    task = await _held(tarpit, client, _over())
    task.cancel()  # the server shutting down
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tarpit.held == 0 and timers.cancelled == 1


@pytest.fixture
def tarpit_app(standin_server: tuple[StandIn, str]) -> Iterator[Any]:
    """A gateway (``.state.url``) allowing 2 keyless requests a minute per address and
    holding the door's 429s a minute (never expiring in a test), one at a time."""
    limits = {
        "unauthenticated_per_minute": 2,
        "over_limit_hold_s": 60,
        "over_limit_max_held": 1,
        "requests_per_minute": 3,
    }
    app = create_app(standin_settings(standin_server[1], limits=limits), environ=ENVIRON)
    with serve(app) as url:
        app.state.url = url
        yield app


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _post(key: bytes = b"not-a-key") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer " + key + b"\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    )


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_over_limit_keyless_requests_are_held_while_keyed_ones_are_served(
    tarpit_app: Any, standin: StandIn
) -> None:
    url, tarpit = tarpit_app.state.url, tarpit_app.tarpit
    for _ in range(2):  # within the address's limit: 401 at once
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=WRONG)
        assert r.status_code == 401
    with _connect(url) as held:
        held.sendall(_post())
        # a keyed request from the same address is served while that refusal is held
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).is_success
        assert tarpit.held == 1
        with _connect(url) as second:  # past the bound: answered at once, then closed
            second.sendall(_post())
            answer = _read_all(second)
        assert answer.startswith(b"HTTP/1.1 429 "), answer
        assert b"\r\nconnection: close\r\n" in answer.lower()
        assert b"\r\nretry-after: " in answer.lower()
    # the held client hung up: its place is freed by the time another request is served
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).is_success
    assert tarpit.held == 0
    assert len(standin.requests) == 2


def test_a_spent_tenant_s_refusals_are_held(tarpit_app: Any, standin: StandIn) -> None:
    url, tarpit = tarpit_app.state.url, tarpit_app.tarpit
    bob = {"authorization": "Bearer bob-key"}
    for _ in range(3):
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=bob).is_success
    with _connect(url) as held:
        held.sendall(_post(b"bob-key"))
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).is_success
        assert tarpit.held == 1
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=ALICE).is_success
    assert tarpit.held == 0 and len(standin.requests) == 5
