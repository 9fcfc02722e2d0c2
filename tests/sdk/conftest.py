"""SDK test fixtures: the stand-in app on a real uvicorn server, and its script."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sdk_standin import Script, create_standin

from tests.gateway.servers import serve


@pytest.fixture(scope="session")
def standin_app() -> Any:
    return create_standin()


@pytest.fixture(scope="session")
def standin_root(standin_app: Any) -> Iterator[str]:
    with serve(standin_app) as url:
        yield url


@pytest.fixture
def script(standin_app: Any) -> Script:
    """A fresh script (and an empty document store) for this test."""
    standin_app.state.script = Script()
    standin_app.state.documents = {}
    return standin_app.state.script


@pytest.fixture
def base_url(standin_root: str, script: Script) -> str:
    """The stand-in's API root, reset for this test."""
    return standin_root + "/v1"
