"""Fixtures for the dashboard tests: a real proxy (SQLite) and real Chromium via Playwright.

Chromium is Debian's (`/usr/bin/chromium`), never a browser downloaded by `playwright
install`. Without it the browser tests skip, except under CI, where they fail. Every page
collects its console errors and uncaught exceptions; a test fails if any appeared that it did
not expect. Screenshots go to `test-artifacts/ui/`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.proxy.conftest import ProxyHarness, demo_upstream, proxy, proxy_factory

__all__ = ["demo_upstream", "proxy", "proxy_factory"]  # re-exported fixtures

CHROMIUM = os.environ.get("UNDOLOG_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
UI_SECRET = "test-ui-secret-" + "x" * 24


@pytest.fixture
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The dashboard tests run on SQLite (the HTTP tests of its API add PostgreSQL)."""
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'undolog.db'}"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must run the browser tests)")
        pytest.skip(message)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Console:
    """Console errors and uncaught page errors, minus those a test says it expects."""

    errors: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


@dataclass
class Dashboard:
    """A browser page on a proxy's dashboard, with helpers for the steps tests repeat."""

    page: Any
    proxy: ProxyHarness
    console: Console

    def open(self, hash_: str = "#/") -> None:
        self.page.goto(f"{self.proxy.url}/ui/{hash_}")

    def sign_in(self, api_key: str | None = None) -> None:
        self.open()
        self.page.get_by_label("API key").fill(api_key or self.proxy.api_key)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.locator("#org-id").filter(has_text=self.proxy.org_id).wait_for()
        self.page.locator("#live[data-state='live']").wait_for()

    def go(self, hash_: str) -> None:
        self.page.evaluate("h => { location.hash = h }", hash_)

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_dashboard(
    browser: Any, proxy: ProxyHarness, **context_options: Any
) -> Iterator[Dashboard]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **context_options)
    page = context.new_page()
    page.set_default_timeout(15_000)
    console = Console()
    page.on(
        "console",
        lambda msg: console.errors.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: console.errors.append(f"pageerror: {exc}"))
    try:
        yield Dashboard(page, proxy, console)
    finally:
        context.close()
    assert console.unexpected() == [], "browser console errors during the test"


@pytest.fixture
def ui_proxy(proxy_factory: Any) -> ProxyHarness:
    """A proxy with a fixed `ui_secret` (so a restarted one accepts the same cookie)."""
    harness: ProxyHarness = proxy_factory(ui_secret=UI_SECRET)
    return harness


@pytest.fixture
def dashboard(browser: Any, ui_proxy: ProxyHarness) -> Iterator[Dashboard]:
    yield from open_dashboard(browser, ui_proxy)
