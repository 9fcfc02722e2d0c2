"""Configuration: the documented TOML shape, errors naming the field, env overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.cli.serve import check_bind, is_loopback, verifier_settings
from gateway.config import ConfigError, build_settings, load_settings

ISSUE_SHAPE = """
[[endpoints]]
name = "openai"
kind = "openai"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4o-mini", "gpt-4.1"]

[[endpoints]]
name = "local"
kind = "local"
model = "smollm2-135m"          # path or alias of the local target
models = ["smollm2"]            # names clients use

[[keys]]
key_env = "DRAFTGATE_KEY_ALICE" # the gateway key is read from this variable
tenant = "alice"

[redis]
url = "redis://127.0.0.1:6379/0"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "draftgate.toml"
    path.write_text(text)
    return path


def test_issue_shape_is_accepted(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, ISSUE_SHAPE), environ={})
    openai_ep, local = settings.endpoints
    assert openai_ep.kind == "openai" and openai_ep.client_names() == ["gpt-4o-mini", "gpt-4.1"]
    assert local.model == "smollm2-135m" and local.client_names() == ["smollm2"]
    assert settings.keys[0].tenant == "alice"
    assert settings.redis.url == "redis://127.0.0.1:6379/0"
    assert [e.name for e in settings.routes()["gpt-4.1"]] == ["openai"]


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(None, environ={})
    (local,) = settings.endpoints
    assert local.kind == "local" and local.model == "smollm2-135m"
    assert local.client_names() == ["smollm2-135m", "smollm2"]
    assert settings.redis.url is None and settings.capture is False
    assert settings.max_body_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (('kind = "openai"', 'kind = "opena1"'), "endpoints.0.kind"),
        (('models = ["smollm2"]', 'models = ["smollm2"]\nretries = -1'), "endpoints.1.retries"),
        (('tenant = "alice"', 'tenant = "alice"\nrole = "admin"'), "keys.0.role"),
        (('url = "redis', 'uri = "redis'), "redis.uri"),
    ],
)
def test_bad_file_names_the_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, ISSUE_SHAPE.replace(*change)), environ={})
    assert field in str(err.value)


def test_semantic_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_version"):
        build_settings(
            {
                "endpoints": [
                    {"name": "a", "kind": "azure", "base_url": "https://x", "models": ["m"]}
                ]
            }
        )
    with pytest.raises(ConfigError, match="base_url"):
        build_settings({"endpoints": [{"name": "v", "kind": "vllm", "models": ["m"]}]})
    with pytest.raises(ConfigError, match="fallback"):
        build_settings({"fallback": {"smollm2": ["nowhere"]}})
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(write(tmp_path, "[[endpoints]\n"), environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml", environ={})


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, ISSUE_SHAPE)
    assert (
        load_settings(path, environ={"REDIS_URL": "redis://other:1/0"}).redis.url
        == "redis://other:1/0"
    )
    env = {"REDIS_URL": "redis://a:1/0", "DRAFTGATE_REDIS_URL": "redis://b:1/0"}
    assert load_settings(path, environ=env).redis.url == "redis://b:1/0"
    monkeypatch.setenv("DRAFTGATE_CAPTURE", "true")
    monkeypatch.setenv("DRAFTGATE_MAX_BODY_BYTES", "4096")
    settings = load_settings(path, environ={})
    assert settings.capture is True and settings.max_body_bytes == 4096
    monkeypatch.setenv("DRAFTGATE_LIMITS", "{not json")
    with pytest.raises(ConfigError, match="invalid configuration in the environment.*limits"):
        load_settings(path, environ={})


def test_fallback_order(tmp_path: Path) -> None:
    settings = build_settings(
        {
            "endpoints": [
                {"name": "a", "kind": "vllm", "base_url": "http://a", "models": ["m"]},
                {
                    "name": "b",
                    "kind": "sglang",
                    "base_url": "http://b",
                    "models": [{"name": "m", "upstream": "M"}],
                },
            ],
            "fallback": {"m": ["b", "a"]},
        }
    )
    assert [e.name for e in settings.routes()["m"]] == ["b", "a"]
    assert settings.endpoints[1].upstream_model("m") == "M"


def test_missing_credentials_stop_start_up() -> None:
    settings = build_settings(
        {
            "endpoints": [
                {"name": "o", "kind": "openai", "api_key_env": "NOPE_KEY", "models": ["gpt-4o"]}
            ]
        }
    )
    with pytest.raises(ConfigError, match="NOPE_KEY"):
        create_app(settings, environ={})
    keyed = build_settings({"keys": [{"key_env": "NOPE_GATEWAY_KEY", "tenant": "t"}]})
    with pytest.raises(ConfigError, match="NOPE_GATEWAY_KEY"):
        create_app(keyed, environ={})


def test_two_key_variables_with_one_value_stop_start_up() -> None:
    keyed = build_settings(
        {
            "keys": [
                {"key_env": "KEY_ALICE", "tenant": "alice"},
                {"key_env": "KEY_BOB", "tenant": "bob"},
            ]
        }
    )
    with pytest.raises(ConfigError, match="KEY_ALICE and KEY_BOB hold the same key"):
        create_app(keyed, environ={"KEY_ALICE": "same", "KEY_BOB": "same"})
    create_app(keyed, environ={"KEY_ALICE": "one", "KEY_BOB": "two"})


def test_public_bind_needs_keys_or_consent() -> None:
    no_keys = build_settings({})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    check_bind(no_keys, "127.0.0.1", allow_public=False)
    with pytest.raises(ConfigError, match="--allow-public"):
        check_bind(no_keys, "0.0.0.0", allow_public=False)
    check_bind(no_keys, "0.0.0.0", allow_public=True)
    keyed = build_settings({"keys": [{"key_env": "K", "tenant": "t"}]})
    check_bind(keyed, "0.0.0.0", allow_public=False)


def test_verifier_settings() -> None:
    settings = verifier_settings("smollm2-135m")
    (endpoint,) = settings.endpoints
    assert endpoint.kind == "local" and endpoint.model == "smollm2-135m"
    assert settings.auth is False
    assert verifier_settings("/models/foo.gguf").endpoints[0].client_names() == ["foo.gguf"]
    assert endpoint.max_batch is None
    assert verifier_settings("smollm2-135m", max_batch=4).endpoints[0].max_batch == 4


def test_serve_refuses_public_bind_without_keys(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--host", "0.0.0.0", "--config", str(write(tmp_path, "capture = false\n"))]
    )
    assert result.exit_code == 2
    assert "--allow-public" in result.output


def test_serve_reports_a_bad_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--config", str(write(tmp_path, "max_body_bytes = 'big'\n"))]
    )
    assert result.exit_code == 2
    assert "max_body_bytes" in result.output


def test_routing_section_openrouter_kind_and_checked_endpoints() -> None:
    settings = build_settings(
        {
            "endpoints": [
                {"name": "or", "kind": "openrouter", "models": ["openai/gpt-4o-mini"]},
                {"name": "v1", "kind": "vllm", "base_url": "http://a/v1", "models": ["q"]},
                {
                    "name": "v2",
                    "kind": "vllm",
                    "base_url": "http://b/v1",
                    "models": ["q"],
                    "health_check": False,
                },
            ],
            "routing": {"strategy": "prefix", "prefix_chars": 256},
        }
    )
    by_name = {e.name: e for e in settings.endpoints}
    assert by_name["or"].base_url == "https://openrouter.ai/api/v1"
    assert settings.routing.strategy == "prefix" and settings.routing.prefix_chars == 256
    assert settings.routing.load_factor == 1.5 and settings.routing.health_check_interval_s == 10
    # hosted providers are not checked unless asked; self-hosted engines are unless told not
    assert [by_name[n].actively_checked for n in ("or", "v1", "v2")] == [False, True, False]
    with pytest.raises(ConfigError, match="routing.strategy"):
        build_settings({"routing": {"strategy": "random"}})
