"""The dashboard in a real browser: headless Chromium from the system's packages driven
by Selenium (the driver given by path: nothing is downloaded). The pages load without
console errors, the overview's numbers change while requests run, a tenant cannot open
another tenant's page. With ``DRAFTGATE_UI_SCREENSHOTS=<dir>`` each page is saved there
as a PNG (the docs' screenshots: ``DRAFTGATE_UI_SCREENSHOTS=docs/ui``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from gateway.app import create_app
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.gateway.test_ui_audits import CATEGORIES, REQUESTS, cli_audit
from tests.openai_standin import StandIn

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20.0
SHOTS = os.environ.get("DRAFTGATE_UI_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1360,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _errors(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console's errors since the last call (reading the log empties it)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _shot(driver: webdriver.Chrome, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1360, max(900, min(int(height) + 160, 2400)))
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))
        driver.set_window_size(1360, 900)


def _sign_in(driver: webdriver.Chrome, url: str, key: str, lands: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{url}/ui/login")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(driver, WAIT_S).until(  # "/ui/" is in the login page's own URL too
        lambda d: lands in d.current_url and "/ui/login" not in d.current_url
    )


def _cell(driver: webdriver.Chrome, endpoint: str, key: str) -> str:
    """A live cell's text (the drafted share's label, not its bar's title), read in one
    script call: the overview re-renders its rows while requests run, so an element
    found first and read after may already be gone."""
    selector = f'tr[data-endpoint="{endpoint}"] td[data-k="{key}"]'
    if key == "drafted_share":
        selector += " span"
    text = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
        selector,
    )
    if text is None:
        raise NoSuchElementException(selector)
    return str(text).strip()


class _Load:
    """Chat requests with a prediction sent in a thread until stopped."""

    def __init__(self, url: str, key: str | None, model: str, prediction: str) -> None:
        self.sent = 0
        self._stop = threading.Event()
        self._args = (url, key, model, prediction)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        url, key, model, prediction = self._args
        headers = {"authorization": f"Bearer {key}"} if key else {}
        body = {
            "model": model,
            "max_tokens": 24,
            "messages": [{"role": "user", "content": f"Repeat exactly: {prediction}"}],
            "prediction": {"type": "content", "content": prediction},
        }
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            while not self._stop.is_set():
                assert client.post("/v1/chat/completions", json=body).status_code == 200
                self.sent += 1

    def __enter__(self) -> _Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_admin_pages_live_numbers_and_no_console_errors(
    browser: webdriver.Chrome, gateway_url: str
) -> None:
    browser.get(f"{gateway_url}/ui/login")
    _shot(browser, "login")
    _sign_in(browser, gateway_url, "ops-key", "/ui/")
    WebDriverWait(browser, WAIT_S).until(
        ec.text_to_be_present_in_element((By.ID, "updated"), "Updated")
    )
    before = _cell(browser, "openai", "requests")
    with _Load(gateway_url, "alice-key", "gpt-4o-mini", "the quick brown fox jumps") as load:
        WebDriverWait(browser, WAIT_S).until(
            lambda d: (
                _cell(d, "openai", "requests") != before
                and _cell(d, "openai", "drafted_share") not in ("", "–")
            )
        )
        assert load.sent > 0
    assert _cell(browser, "openai", "output_tokens_per_s") != "0.0"
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-requests svg polyline")
    _shot(browser, "overview")
    assert _errors(browser) == []

    for path, shot, marker in (
        ("/ui/endpoints", "endpoints", "section.card[data-endpoint='vllm']"),
        ("/ui/tenants", "tenants", "#tenants"),
        ("/ui/tenant?name=alice", "tenant", "#documents"),
    ):
        browser.get(f"{gateway_url}{path}")
        WebDriverWait(browser, WAIT_S).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, marker))
        )
        _shot(browser, shot)
        assert _errors(browser) == [], path

    browser.find_element(By.ID, "logout").click()
    WebDriverWait(browser, WAIT_S).until(ec.url_contains("/ui/login"))
    browser.get(f"{gateway_url}/ui/endpoints")
    assert browser.current_url.endswith("/ui/login")  # the session ended
    assert _errors(browser) == []


@pytest.fixture(scope="module")
def audits_gateway(
    standin_server: tuple[StandIn, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A gateway in front of the stand-in with an ``audit_dir``: its URL and the folder."""
    audit_dir = tmp_path_factory.mktemp("audits")
    settings = standin_settings(standin_server[1], audit_dir=str(audit_dir))
    with serve(create_app(settings, environ=ENVIRON)) as url:
        yield url, audit_dir


def test_an_audit_started_from_the_page_finishes_with_its_plots(
    browser: webdriver.Chrome, audits_gateway: tuple[str, Path], tmp_path: Path
) -> None:
    """The command line's run is listed beside the page's; the page's run shows its
    report and its SVG plots."""
    audits_url, audit_dir = audits_gateway
    from_cli = cli_audit(audits_url, tmp_path, audit_dir)
    _sign_in(browser, audits_url, "ops-key", "/ui/")
    browser.get(f"{audits_url}/ui/audits")
    listed = browser.find_element(By.CSS_SELECTOR, f'#runs tr[data-run="{from_cli}"]')
    assert "openai" in listed.text and "done" in listed.text
    form = browser.find_element(By.ID, "audit-form")
    Select(form.find_element(By.ID, "endpoint")).select_by_visible_text("openai")
    for category in CATEGORIES:
        form.find_element(By.CSS_SELECTOR, f"input[value='{category}']").click()
    form.find_element(By.ID, "requests").send_keys(str(REQUESTS))
    form.find_element(By.ID, "audit-key").send_keys("ops-key")
    _shot(browser, "audits")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, WAIT_S).until(ec.url_contains("/ui/audit?id="))
    WebDriverWait(browser, 120).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "#speedup tbody tr"))
    )
    identical = browser.find_element(By.ID, "identical").text
    assert identical.endswith(" pairs identical")
    plots = browser.find_elements(By.CSS_SELECTOR, "figure img")
    assert len(plots) == 3
    WebDriverWait(browser, WAIT_S).until(
        lambda d: all(d.execute_script("return arguments[0].naturalWidth", p) > 0 for p in plots)
    )
    report = browser.find_element(By.ID, "report")
    assert report.find_element(By.TAG_NAME, "h1").text.startswith("Audit of endpoint openai")
    assert len(report.find_elements(By.TAG_NAME, "table")) > 5
    _shot(browser, "audit")
    assert _errors(browser) == []
    browser.get(f"{audits_url}/ui/audits")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert len(rows) == 2 and rows[1].get_attribute("data-run") == from_cli  # newest first
    for row in rows:
        assert "openai" in row.text and "done" in row.text
        assert identical.replace(" of ", "/").removesuffix(" pairs identical") in row.text
    _shot(browser, "audits-listed")
    assert _errors(browser) == []


def test_a_tenant_cannot_open_another_tenants_page(
    browser: webdriver.Chrome, gateway_url: str
) -> None:
    _sign_in(browser, gateway_url, "alice-key", "/ui/tenant?name=alice")
    assert browser.find_element(By.ID, "tenant-name").text == "alice"
    assert _errors(browser) == []
    browser.get(f"{gateway_url}/ui/tenant?name=bob")
    message = browser.find_element(By.ID, "error").text
    assert message == "a tenant key sees its own tenant's page only"
    assert [e for e in _errors(browser) if "403" in e["message"]]  # the page's own status


def test_a_wrong_key_is_refused_on_the_sign_in_page(
    browser: webdriver.Chrome, gateway_url: str
) -> None:
    browser.delete_all_cookies()
    browser.get(f"{gateway_url}/ui/login")
    browser.find_element(By.ID, "key").send_keys("not-a-key")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(browser, WAIT_S).until(
        ec.text_to_be_present_in_element((By.ID, "login-error"), "invalid gateway API key")
    )
    assert browser.current_url.endswith("/ui/login")
    assert [e for e in _errors(browser) if "401" in e["message"]]  # the sign-in's answer


def test_local_endpoint_engine_and_drafted_share(browser: webdriver.Chrome, local_url: str) -> None:
    """The loopback default (no keys): open without signing in; the real local model."""
    browser.delete_all_cookies()
    browser.get(f"{local_url}/ui/")
    WebDriverWait(browser, WAIT_S).until(
        ec.text_to_be_present_in_element((By.ID, "updated"), "Updated")
    )
    text = "def add(a, b):\n    return a + b\n"
    with _Load(local_url, None, "smollm2-135m", text):
        WebDriverWait(browser, 60).until(
            lambda d: (
                _cell(d, "local", "drafted_share").endswith("%")
                and _cell(d, "local", "drafted_share") != "0%"
            )
        )
        _shot(browser, "overview-local")
        browser.get(f"{local_url}/ui/endpoints")  # the engine while requests run
        _shot(browser, "endpoints-local")
    card = browser.find_element(By.CSS_SELECTOR, "section.card[data-endpoint='local']")
    assert "loaded" in card.text and "preemptions" in card.text
    assert "blocks in use" in card.find_element(By.CSS_SELECTOR, ".kv-pool").text
    assert card.find_elements(By.CSS_SELECTOR, ".kv-pool svg rect")
    assert card.find_element(By.CSS_SELECTOR, ".step-costs th").text == "Rows"
    assert card.find_element(By.CSS_SELECTOR, ".threads").text
    assert _errors(browser) == []
