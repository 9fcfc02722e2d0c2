"""``sdk/client.py`` is generated from ``sdk/async_client.py``: one place to change a method."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

from sdk import AsyncClient, Client
from sdk.documents import AsyncDocuments, Documents

TOOL = Path(__file__).resolve().parents[2] / "tools" / "unasync.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_sync_client_is_what_the_generator_makes() -> None:
    tool = _tool()
    generated = tool.unasync(tool.SOURCE.read_text(encoding="utf-8"))
    assert tool.TARGET.read_text(encoding="utf-8") == generated, (
        "sdk/client.py is stale: edit sdk/async_client.py and run python tools/unasync.py"
    )


def test_generator_turns_a_new_async_method_into_a_sync_one() -> None:
    source = (
        "class AsyncClient:\n"
        "    async def ping(self) -> AsyncStream[str]:\n"
        "        async with await self._open() as s:\n"
        "            async for x in s:\n"
        "                await asyncio.to_thread(f, x)\n"
        "        await self._http.aclose()\n"
    )
    assert _tool().unasync(source).splitlines()[1:] == [
        "class Client:",
        "    def ping(self) -> Stream[str]:",
        "        with self._open() as s:",
        "            for x in s:",
        "                f(x)",
        "        self._http.close()",
    ]


def _api(cls: type) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_both_clients_have_the_same_public_methods_and_parameters() -> None:
    sync, asynchronous = _api(Client), _api(AsyncClient)
    asynchronous["close"] = asynchronous.pop("aclose")
    assert sync == asynchronous


def test_both_document_apis_have_the_same_methods_and_parameters() -> None:
    """``Documents``/``AsyncDocuments`` are written side by side; this keeps them equal."""
    assert _api(Documents) == _api(AsyncDocuments)
