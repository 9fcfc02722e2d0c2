"""The dashboard's access rules and bad input over real HTTP (the gateway in front of the
stand-in; keys alice-key, bob-key, ops-key the admin), and its rolling window."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from gateway.app import create_app
from gateway.auth import Authenticator
from gateway.errors import AuthenticationFailed
from gateway.rolling import KEEP_S, RollingWindow, Row
from gateway.ui import PATHS
from gateway.ui.session import COOKIE, SESSION_S, Sessions, Viewer
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn


def _signed_in(url: str, key: str) -> httpx.Client:
    client = httpx.Client(base_url=url)
    response = client.post("/ui/login", json={"key": key}, headers={"origin": url})
    assert response.status_code == 200, response.text
    return client


@pytest.fixture(scope="module")
def open_url(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    """A gateway with no keys (the loopback default)."""
    app = create_app(standin_settings(standin_server[1], keys=[]), environ=ENVIRON)
    with serve(app) as url:
        yield url


def test_sign_in_sets_a_strict_http_only_cookie_never_holding_the_key(gateway_url: str) -> None:
    response = httpx.post(
        f"{gateway_url}/ui/login", json={"key": "ops-key"}, headers={"origin": gateway_url}
    )
    assert response.status_code == 200
    assert response.json() == {"tenant": "ops", "next": "/ui/"}
    cookie = response.headers["set-cookie"].lower()
    assert cookie.startswith(f"{COOKIE}=")
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "ops-key" not in cookie


@pytest.mark.parametrize("path", ["/ui/", "/ui/endpoints", "/ui/tenants", "/ui/tenant"])
def test_pages_without_a_session_go_to_sign_in_whatever_the_host(
    gateway_url: str, path: str
) -> None:
    for host in ("127.0.0.1", "dashboard.example.com"):
        response = httpx.get(f"{gateway_url}{path}", headers={"host": host})
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/login"
    live = httpx.get(f"{gateway_url}/ui/overview.json", headers={"host": "dashboard.example.com"})
    assert live.status_code == 401
    assert live.json()["error"]["type"] == "authentication_error"


def test_no_keys_serves_loopback_hosts_only(open_url: str) -> None:
    assert httpx.get(f"{open_url}/ui", follow_redirects=True).status_code == 200
    for path in ("/ui", "/ui/login", "/ui/overview.json"):
        refused = httpx.get(f"{open_url}{path}", headers={"host": "evil.example"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "host_not_allowed"


def test_a_tenant_sees_its_own_page_only(gateway_url: str) -> None:
    alice = _signed_in(gateway_url, "alice-key")
    assert alice.get("/ui/tenant?name=alice").status_code == 200
    for path in ("/ui/tenant?name=bob", "/ui/tenants", "/ui/endpoints"):
        page = alice.get(path)
        assert page.status_code == 403, path
        assert "text/html" in page.headers["content-type"]
        assert "Traceback" not in page.text
    assert alice.get("/ui/overview.json").status_code == 403
    overview = alice.get("/ui/")  # a tenant's overview is its own page
    assert overview.status_code == 303
    assert overview.headers["location"] == "/ui/tenant?name=alice"


def test_the_admin_sees_every_page(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    for path in ("/ui/", "/ui/endpoints", "/ui/tenants", "/ui/tenant?name=bob"):
        page = ops.get(path)
        assert page.status_code == 200, path
        assert "default-src 'none'" in page.headers["content-security-policy"]
    assert {row["endpoint"] for row in ops.get("/ui/overview.json").json()["endpoints"]} >= {
        "openai",
        "vllm",
    }
    missing = ops.get("/ui/tenant?name=nobody")
    assert missing.status_code == 404 and "nobody" in missing.text


def test_an_api_key_header_works_and_a_wrong_one_is_a_401_page(gateway_url: str) -> None:
    ok = httpx.get(f"{gateway_url}/ui/endpoints", headers={"authorization": "Bearer ops-key"})
    assert ok.status_code == 200
    wrong = httpx.get(f"{gateway_url}/ui/endpoints", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert "invalid gateway API key" in wrong.text and "Traceback" not in wrong.text


def test_sign_in_refuses_wrong_keys_and_bad_bodies(gateway_url: str) -> None:
    origin = {"origin": gateway_url}
    wrong = httpx.post(f"{gateway_url}/ui/login", json={"key": "nope"}, headers=origin)
    assert wrong.status_code == 401
    assert "set-cookie" not in wrong.headers
    for body in ({}, {"key": 3}, {"key": ""}, ["ops-key"]):
        bad = httpx.post(f"{gateway_url}/ui/login", json=body, headers=origin)
        assert bad.status_code == 400, body
    broken = httpx.post(
        f"{gateway_url}/ui/login",
        content=b'{"key": ',
        headers={**origin, "content-type": "application/json"},
    )
    assert broken.status_code == 400
    form = httpx.post(f"{gateway_url}/ui/login", data={"key": "ops-key"}, headers=origin)
    assert form.status_code == 415  # a cross-site form cannot send JSON


@pytest.mark.parametrize(
    "headers",
    [{}, {"origin": "https://evil.example"}, {"referer": "https://evil.example/page"}],
)
def test_posts_from_another_origin_are_refused(gateway_url: str, headers: dict[str, str]) -> None:
    login = httpx.post(f"{gateway_url}/ui/login", json={"key": "ops-key"}, headers=headers)
    assert login.status_code == 403
    assert "set-cookie" not in login.headers
    ops = _signed_in(gateway_url, "ops-key")
    assert ops.post("/ui/logout", json={}, headers=headers).status_code == 403
    assert ops.get("/ui/endpoints").status_code == 200  # still signed in


def test_sign_out_ends_the_session(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    token = ops.cookies[COOKIE]
    assert ops.post("/ui/logout", json={}, headers={"origin": gateway_url}).status_code == 200
    again = httpx.get(f"{gateway_url}/ui/endpoints", cookies={COOKIE: token})
    assert again.status_code == 303


def test_dashboard_paths_are_the_routes_served(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    for path in PATHS - {"/ui/logout", "/ui/login"}:
        served = ops.get(path, follow_redirects=True)
        assert served.status_code == 200 or "no audit" in served.text, path  # an id is needed
    assert ops.get("/ui").headers["location"].endswith("/ui/")
    unknown = ops.get("/ui/nothing", headers={"authorization": "Bearer ops-key"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "no route GET /ui/nothing"


def test_rolling_window_figures_and_expiry() -> None:
    now = [1000.0]
    window = RollingWindow(clock=lambda: now[0])
    for i in range(4):
        window.add("a", Row(now[0] - i, i == 3, 0.1 * (i + 1), 0.01, 10, 4))
    figures = window.figures("a", 60.0)
    assert (figures.requests, figures.errors) == (4, 1)
    assert figures.ttft_p50 == pytest.approx(0.2) and figures.ttft_p99 == pytest.approx(0.4)
    assert figures.drafted_share == 0.4
    assert figures.output_tokens_per_s == 40 / 60.0
    assert sum(r for r, _ in window.series("a", 60.0, 6)) == 4
    now[0] += KEEP_S + 10
    window.add("a", Row(now[0], False, None, None, 0, 0))
    assert window.figures("a", KEEP_S).requests == 1
    assert window.figures("a", 60.0).drafted_share is None


def test_audit_starts_refuse_bad_input(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    origin = {"origin": gateway_url}
    good = {"endpoint": "openai", "categories": ["repeat"], "requests": 1, "key": "ops-key"}
    cases: list[tuple[dict[str, object], dict[str, str], int]] = [
        ({**good, "key": None}, origin, 400),
        ({**good, "key": "alice-key"}, origin, 403),
        ({**good, "key": "nope"}, origin, 401),
        ({**good, "endpoint": "nowhere"}, origin, 404),
        ({**good, "categories": ["nonsense"]}, origin, 400),
        ({**good, "concurrency": [0]}, origin, 400),
        ({**good, "surprise": 1}, origin, 400),
        (good, {"origin": "https://evil.example"}, 403),
        (good, {}, 403),
    ]
    for body, headers, status in cases:
        response = ops.post("/ui/audits", json=body, headers=headers)
        assert response.status_code == status, (body, headers, response.text)
        assert response.json()["error"]["message"]
    alice = _signed_in(gateway_url, "alice-key")
    assert alice.post("/ui/audits", json=good, headers=origin).status_code == 403
    assert alice.get("/ui/audits").status_code == 403


def test_unknown_audits_are_404s(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    page = ops.get("/ui/audit?id=nothing")
    assert page.status_code == 404
    assert "no audit &#39;nothing&#39; on this gateway" in page.text
    assert ops.get("/ui/audit.json?id=nothing").status_code == 404
    assert ops.get("/ui/audit/plot?id=nothing&name=ttft.png").status_code == 404
    assert ops.get("/ui/audit").status_code == 404


def test_wrong_keys_at_sign_in_are_limited_per_address(
    standin_server: tuple[StandIn, str],
) -> None:
    settings = standin_settings(standin_server[1], limits={"unauthenticated_per_minute": 2})
    with serve(create_app(settings, environ=ENVIRON)) as url:
        statuses = [
            httpx.post(f"{url}/ui/login", json={"key": "nope"}, headers={"origin": url})
            for _ in range(3)
        ]
        assert [r.status_code for r in statuses] == [401, 401, 429]
        assert int(statuses[2].headers["retry-after"]) >= 1
        ok = httpx.post(f"{url}/ui/login", json={"key": "ops-key"}, headers={"origin": url})
        assert ok.status_code == 200  # a right key still signs in


def test_a_local_endpoints_engine_is_shown_from_its_snapshot(local_url: str, engine: Any) -> None:
    """The loopback default (no keys) on the real local model: the endpoints page shows
    the engine's snapshot (``Engine.stats``)."""
    page = httpx.get(f"{local_url}/ui/endpoints")
    assert page.status_code == 200
    stats = engine.stats()
    card = page.text.split('data-endpoint="local"')[1].split("</section>")[0]
    assert f"of {stats.kv_blocks_total} blocks in use" in card
    assert "no request running or waiting" in card  # idle between tests
    header = "".join(f"<th>{rows}</th>" for rows in stats.step_s_at_start)
    assert f"<th>Rows</th>{header}</tr>" in card
    start = "".join(f"<td>{s * 1000:.2f}</td>" for s in stats.step_s_at_start.values())
    assert f"<td>at start-up (ms)</td>{start}</tr>" in card
    if stats.threads is None:
        assert "not chosen online" in card
    else:
        assert f"{stats.threads.chosen} chosen of 1, " in card
    assert f"<td>weights_bytes</td><td>{stats.memory['weights_bytes']:,}</td>" in card


def test_malformed_audit_forms_are_400s_and_forms_415s(gateway_url: str) -> None:
    ops = _signed_in(gateway_url, "ops-key")
    origin = {"origin": gateway_url}
    good = {"endpoint": "openai", "categories": ["repeat"], "requests": 1, "key": "ops-key"}
    json_headers = {**origin, "content-type": "application/json"}
    for raw in (b'{"endpoint": ', b"[]", b'"openai"', b"\xff\xfe"):
        broken = ops.post("/ui/audits", content=raw, headers=json_headers)
        assert broken.status_code == 400, raw
        assert broken.json()["error"]["type"] == "invalid_request_error"
    for body in (
        {**good, "categories": [["repeat"]]},
        {**good, "categories": "repeat"},
        {**good, "concurrency": "1"},
        {**good, "requests": "two"},
        {**good, "endpoint": 7},
    ):
        refused = ops.post("/ui/audits", json=body, headers=origin)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["message"]
    form = ops.post("/ui/audits", data={"endpoint": "openai", "key": "ops-key"}, headers=origin)
    assert form.status_code == 415  # a cross-site form cannot send JSON
    assert "Traceback" not in form.text


def test_a_wrong_key_on_the_json_routes_is_a_json_401(gateway_url: str) -> None:
    for path in ("/ui/overview.json", "/ui/audit.json?id=x", "/ui/audit/plot?id=x&name=y"):
        wrong = httpx.get(f"{gateway_url}{path}", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401, path
        assert wrong.json()["error"]["type"] == "authentication_error"
        assert "nope" not in wrong.text


def test_an_expired_session_is_signed_out() -> None:
    now = [0.0]
    sessions = Sessions(Authenticator({"ops-key": "ops"}, admins=["ops-key"]), lambda: now[0])
    token, viewer = sessions.sign_in("ops-key")
    cookie = f"{COOKIE}={token}".encode()
    request = Request({"type": "http", "headers": [(b"cookie", cookie)]})
    assert sessions.viewer(request) == viewer == Viewer("ops", admin=True)
    now[0] += SESSION_S
    assert sessions.viewer(request) is None  # ended: the pages send it to sign-in
    now[0] -= SESSION_S
    assert sessions.viewer(request) is None  # and it was forgotten
    with pytest.raises(AuthenticationFailed):
        sessions.sign_in("ops-key-wrong")


def test_an_unknown_session_cookie_goes_to_sign_in(gateway_url: str) -> None:
    stale = {COOKIE: "not-a-session"}
    page = httpx.get(f"{gateway_url}/ui/audits", cookies=stale)
    assert page.status_code == 303 and page.headers["location"] == "/ui/login"
    data = httpx.get(f"{gateway_url}/ui/audit.json?id=x", cookies=stale)
    assert data.status_code == 401
