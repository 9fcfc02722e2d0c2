"""The version is written once, in ``sdk/__init__.py``; the package metadata and CLI read it."""

from __future__ import annotations

import sys
from pathlib import Path

from typer.testing import CliRunner

import sdk
from gateway.cli import app
from sdk._core import default_headers

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_pyproject_takes_the_version_from_the_sdk() -> None:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert "version" not in config["project"]
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sdk.__version__"}


def test_cli_and_user_agent_report_it() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"draftgate {sdk.__version__}"
    assert default_headers(None, None)["User-Agent"] == f"draftgate-sdk/{sdk.__version__}"
