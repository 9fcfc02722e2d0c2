"""SDK test fixtures: the stand-in OpenAI server on a real uvicorn server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.servers import serve
from tests.openai_standin import StandIn


@pytest.fixture(scope="session")
def standin_server() -> Iterator[tuple[StandIn, str]]:
    standin = StandIn()
    with serve(standin) as url:
        yield standin, url


@pytest.fixture(scope="session")
def standin_root(standin_server: tuple[StandIn, str]) -> str:
    return standin_server[1]


@pytest.fixture
def standin(standin_server: tuple[StandIn, str]) -> StandIn:
    """The stand-in with a fresh script, nothing seen and no documents, for this test."""
    standin_server[0].reset()
    return standin_server[0]


@pytest.fixture
def base_url(standin_root: str, standin: StandIn) -> str:
    """The stand-in's API root, reset for this test."""
    return standin_root + "/v1"
