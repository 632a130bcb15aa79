"""The built website, opened page by page in Debian's chromium through Playwright (no browser download).

Needs README command 1 (which builds `_build/html`) and `/usr/bin/chromium`. Asserts the theme loaded, no
page shows a traceback or an error cell, images load, math is typeset, widgets render, search and dark mode
work, and nothing local fails to load (served on 127.0.0.1 only: the site must work offline).
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
SKIP_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static", "_vendor", "mathjax"}
PAGES = sorted(
    str(p.relative_to(SITE)) for p in SITE.rglob("*.html")
    if not SKIP_DIRS & set(p.relative_to(SITE).parts) and p.name not in {"genindex.html", "search.html"}
) if SITE.is_dir() else []
# Widget icon fonts are requested by a relative path the html-manager computes; cosmetic when missing.
IGNORED_FAILURES = (".woff", ".woff2", ".ttf", ".eot")


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail("the website is not built: run README command 1 (jupyter-book build . -W) first")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output readable
            pass

    handler = functools.partial(Quiet, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("Debian chromium is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    failures: list[str] = []
    page.on("requestfailed", lambda r: failures.append(f"failed {r.url}"))
    page.on("response", lambda r: r.status >= 400 and failures.append(f"{r.status} {r.url}"))
    page.goto(url, wait_until="networkidle")
    return page, failures


def local_failures(failures: list[str]) -> list[str]:
    return [f for f in failures if "127.0.0.1" in f and not f.endswith(IGNORED_FAILURES)]


def test_site_has_pages():
    assert "intro.html" in PAGES or "index.html" in PAGES
    assert any(p.startswith("chapters/") for p in PAGES)


@pytest.mark.site
@pytest.mark.parametrize("page_path", PAGES)
def test_page(server, browser, page_path):
    page, failures = open_page(browser, f"{server}/{page_path}")
    try:
        themed = page.wait_for_function(
            "() => [...document.styleSheets].some(s => (s.href || '').includes('sphinx-book-theme'))"
            " && !!document.querySelector('.bd-sidebar-primary')", timeout=15000)
        assert themed, "sphinx-book-theme did not load"
        text = page.inner_text("body")
        assert "Traceback (most recent call last)" not in text
        assert page.locator(".output.traceback, .output.error").count() == 0, "page shows an error cell"
        broken = page.evaluate(
            "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
        assert not broken, f"images that did not load: {broken}"
        # state="attached": math or a widget may sit inside a collapsed solution dropdown
        if page.locator(".math").count():
            page.wait_for_selector("mjx-container", state="attached", timeout=15000)
        if page.locator("script[type='application/vnd.jupyter.widget-view+json']").count():
            page.wait_for_selector(".jupyter-widgets", state="attached", timeout=15000)
        assert not local_failures(failures), f"requests that failed: {local_failures(failures)}"
    finally:
        page.close()


@pytest.mark.site
def test_math_and_widget_render_offline(server, browser):
    page, _ = open_page(browser, f"{server}/chapters/00-before-you-start/01-environment.html")
    try:
        page.wait_for_selector("mjx-container", timeout=15000)
        page.wait_for_selector(".widget-slider", timeout=15000)
        assert "ranks n" in page.inner_text(".jupyter-widgets >> nth=0")
    finally:
        page.close()


@pytest.mark.site
def test_notebook_pages_offer_download_and_launch(server, browser):
    page, _ = open_page(browser, f"{server}/chapters/00-before-you-start/01-environment.html")
    try:
        hrefs = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)")
        ipynb = [h for h in hrefs if h.endswith(".ipynb") and "127.0.0.1" in h]
        assert ipynb, "no .ipynb download link"
        assert page.request.get(ipynb[0]).status == 200
        assert any("colab.research.google.com" in h for h in hrefs)
        assert any("mybinder.org" in h for h in hrefs)
    finally:
        page.close()


@pytest.mark.site
def test_search_finds_pages(server, browser):
    page, _ = open_page(browser, f"{server}/search.html?q=busbw")
    try:
        page.wait_for_selector("#search-results li", timeout=20000)
        assert page.locator("#search-results li").count() >= 1
    finally:
        page.close()


@pytest.mark.site
def test_dark_mode_switch(server, browser):
    page, _ = open_page(browser, f"{server}/intro.html")
    try:
        before = page.evaluate("() => document.documentElement.dataset.theme")
        seen = {before}
        for _ in range(3):
            page.locator(".theme-switch-button").first.click()
            seen.add(page.evaluate("() => document.documentElement.dataset.theme"))
        assert "dark" in seen and "light" in seen
    finally:
        page.close()


@pytest.mark.site
def test_chapter_pages_show_badge_and_stamp(server, browser):
    page, _ = open_page(browser, f"{server}/chapters/00-before-you-start/01-environment.html")
    try:
        assert "Hardware:" in page.inner_text(".pt215-needs")
        assert "Last verified: torch 2.15.0" in page.inner_text(".pt215-verified")
    finally:
        page.close()
