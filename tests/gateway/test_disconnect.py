"""A client that goes away mid-stream cancels the upstream request within a second."""

from __future__ import annotations

import json
import threading

import httpx

from tests.openai_standin import StandIn


def test_client_disconnect_cancels_upstream(gateway_url: str, standin: StandIn) -> None:
    body = {"model": "slow-stream", "messages": [{"role": "user", "content": "x"}], "stream": True}
    got_chunk = threading.Event()
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST",
            f"{gateway_url}/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer alice-key"},
        ) as response,
    ):
        assert response.status_code == 200
        # held in a variable: leaving the loop must not close the generator (and with it
        # the connection) before the checks below
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: ") and "tick" in json.dumps(line):
                got_chunk.set()
                break
        assert standin.slow_started.is_set() and got_chunk.is_set()
        assert not standin.cancelled.is_set()
    # leaving the blocks closed the client's connection: the upstream must see it go
    assert standin.cancelled.wait(timeout=1.0)
