"""The built website, opened page by page in Debian's chromium through Playwright (no browser download).

Needs README command 1 (which builds `_build/html`) and `/usr/bin/chromium`. Every page is opened at a phone
width (390 px) and a laptop width (1366 px), once per width: checked in light mode, then switched to dark mode in
place (as the theme's switch does) and checked again, and must: load its theme, show no traceback
or error cell, load every image, carry real alt text on every figure, fit the viewport (no sideways panning),
log no console error and fail no request (served on 127.0.0.1 only: the site must work offline), and show each
widget once. Outputs keep their lines (they scroll, never wrap), inline code names never break inside a word,
figures are numbered and captioned and stay legible on a phone, skipped hardware cells are notes, every page has
the book's title and the whole-book download in its header and a description for link previews, and no page
loads MathJax or the search index. The ☰ and "On this page" buttons must open their panels on a phone and the ☰
must collapse the sidebar on a laptop. Widgets must change what their text says when used, with no kernel. On a
first visit the landing page weighs at most 1.1 MB and every page at most 1.5 MB; `_build/site-weights.json`
records every page's weight.

One browser for the module, one context (and one tab) per width, reused page after page.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
SKIP_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static", "_vendor", "mathjax"}
PAGES = sorted(
    str(p.relative_to(SITE)) for p in SITE.rglob("*.html")
    if not SKIP_DIRS & set(p.relative_to(SITE).parts) and p.name not in {"genindex.html", "search.html"}
    and 'http-equiv="Refresh"' not in p.read_text(encoding="utf-8")[:2000]  # index.html: a redirect to intro
) if SITE.is_dir() else []
VIEWS = [(390, 844, "light"), (1366, 900, "light")]  # each page opens once per width; dark is switched in place
FIRST_VISIT = (1366, 900, "light")  # the view whose tab opens every page with an empty cache
LANDING_BUDGET = 1_100_000  # bytes on a first visit
PAGE_BUDGET = 1_500_000  # the heaviest page, bytes on a first visit
PHONE_FIGURE_SCALE = 0.45  # a figure's shown/stored width on a phone: its 10 pt labels (20 px at 144 dpi) >= 9 px
WEIGHTS: dict[str, int] = {}  # page -> bytes fetched on a first visit (filled by the FIRST_VISIT tab)
PATH_LIKE = re.compile(r"(^|/)[\w.-]+\.(png|jpe?g|svg|gif)$|^_images/|^\.\./")


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
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


class Tab:
    """One tab at one width and colour scheme, reused for every page; records what each visit loaded."""

    def __init__(self, browser, server: str, width: int, height: int, scheme: str, fresh: bool = False):
        # fresh: the browser's cache is off in this tab (DevTools' "Disable cache"), so every visit fetches what a
        # first visit fetches, and its weight is recorded
        self.server, self.scheme, self.fresh, self.browser, self.width = server, scheme, fresh, browser, width
        self.view = {"viewport": {"width": width, "height": height}, "color_scheme": scheme}
        self._new_context()

    def _new_context(self) -> None:
        scheme = self.scheme
        self.ctx = self.browser.new_context(**self.view)
        self.ctx.add_init_script(f"localStorage.setItem('mode', '{scheme}');"
                                 f" localStorage.setItem('theme', '{scheme}');")
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.loaded: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"failed {r.url} ({r.failure})"))
        self.page.on("response", self._response)
        if self.fresh:
            cdp = self.ctx.new_cdp_session(self.page)
            cdp.send("Network.enable")
            cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})

    def _response(self, r) -> None:
        if r.status >= 400:
            self.errors.append(f"{r.status} {r.url}")
        else:
            self.loaded.append(r.url)

    def open(self, path: str):
        """Go to `path`; a `fresh` tab (cache off) records the page's first-visit weight."""
        self.errors.clear()
        self.loaded.clear()
        self.page.goto(f"{self.server}/{path}", wait_until="load")
        if self.fresh:
            self.page.evaluate("() => document.fonts.ready")
            WEIGHTS[path] = weight(self.loaded)
        return self.page


@pytest.fixture(scope="module")
def tabs(browser, server):
    made = {v: Tab(browser, server, *v, fresh=v == FIRST_VISIT) for v in VIEWS}
    yield made
    for t in made.values():
        t.ctx.close()


def site_file(url: str) -> Path | None:
    p = SITE / unquote(urlparse(url).path).lstrip("/")
    return p if p.is_file() else None


def weight(urls: list[str]) -> int:
    """Bytes the browser fetched: the served files (no compression on this server)."""
    return sum(f.stat().st_size for f in {site_file(u) for u in urls} if f)


def open_page(tab: Tab, path: str):
    """Open `path` in `tab` and wait until the theme, math, widgets and fonts have settled."""
    page = tab.open(path)
    page.wait_for_function("() => !!document.querySelector('.bd-sidebar-primary') && [...document.styleSheets]"
                           ".some(s => (s.href || '').includes('sphinx-book-theme'))", timeout=15000)
    if page.locator(".math").count():
        page.wait_for_selector("mjx-container", state="attached", timeout=15000)
    if page.locator("script[type='application/vnd.jupyter.widget-view+json']").count():
        page.wait_for_selector(".jupyter-widgets", state="attached", timeout=15000)
    page.evaluate("() => document.fonts.ready")
    _settle(page)
    return page


def _settle(page) -> None:
    try:  # a page may be wider for a moment while the theme's sidebars settle; a real overflow stays
        page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth + 1", timeout=2000)
    except Exception:
        pass  # reported by inspect, with the elements that stick out


def switch_scheme(page, scheme: str) -> None:
    """Switch the open page to `scheme` the way the theme's button does (data-mode and data-theme on <html>)."""
    page.evaluate("""s => { localStorage.setItem('mode', s); localStorage.setItem('theme', s);
      document.documentElement.dataset.mode = s; document.documentElement.dataset.theme = s; }""", scheme)
    _settle(page)


def inspect(tab: Tab, page, path: str, scheme: str) -> list[str]:
    """Everything a reader would notice on the open page in colour `scheme`; returns what is wrong (empty: fine)."""
    problems: list[str] = []
    facts = page.evaluate(r"""() => {
      const art = document.querySelector('.bd-article') || document.body;
      const imgs = [...document.images];
      return {
        theme: document.documentElement.dataset.theme,
        background: getComputedStyle(document.body).backgroundColor,
        text: document.body.innerText,
        errorCells: document.querySelectorAll('.output.traceback, .output.error').length,
        broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
        figures: [...art.querySelectorAll('img')].map(i => ({alt: i.getAttribute('alt') || '',
                   src: i.getAttribute('src'), w: i.getBoundingClientRect().width, natural: i.naturalWidth,
                   col: art.getBoundingClientRect().width, scrolls: !!i.closest('.pt215-figure-scroll'),
                   output: !!i.closest('.cell_output'),
                   caption: (i.closest('figure.pt215-figure')?.querySelector('figcaption')?.innerText || '')})),
        wrapping: [...document.querySelectorAll('.cell_output pre, .pt215-widget pre')]
                 .filter(p => getComputedStyle(p).whiteSpace !== 'pre').length,
        skippedOutputs: [...document.querySelectorAll('.cell_output .output pre')]
                 .filter(p => p.innerText.includes('[skipped]')).length,
        midWord: [...document.querySelectorAll('.bd-article code.literal')].filter(c => {
                 if (window.innerWidth < 992 || c.getClientRects().length < 2 || !c.innerText.trim()) return false;
                 const walk = document.createTreeWalker(c, NodeFilter.SHOW_TEXT), r = document.createRange();
                 let top = null, prev = '';
                 for (let n = walk.nextNode(); n; n = walk.nextNode())
                   for (let k = 0; k < n.length; k++) {
                     r.setStart(n, k); r.setEnd(n, k + 1);
                     const box = r.getClientRects()[0];
                     if (!box) continue;
                     if (top !== null && box.top > top + 2 && !/[\s_.\/:,(\[=\-]/.test(prev) && !/\s/.test(n.data[k]))
                       return true;
                     top = box.top; prev = n.data[k];
                   }
                 return false; }).map(c => c.innerText.slice(0, 60)),
        headerTitle: [...document.querySelectorAll('.pt215-header-title')].filter(e => e.offsetParent).length,
        download: [...document.querySelectorAll('a.pt215-download')].filter(e => e.offsetParent)
                 .map(a => a.getAttribute('href')),
        description: document.querySelector('meta[name=description]')?.content || '',
        preview: document.querySelector('meta[property="og:image"]')?.content || '',
        scrollW: document.documentElement.scrollWidth, viewW: window.innerWidth,
        wide: [...document.body.querySelectorAll('*')].filter(e => {
                 if (e.getBoundingClientRect().right <= window.innerWidth + 1) return false;
                 for (let a = e.parentElement; a && a !== document.body; a = a.parentElement)
                   if (getComputedStyle(a).overflowX !== 'visible') return false;  // scrolls or clips inside a box
                 return true; }).slice(0, 3).map(e => e.tagName + '.' + e.className + ': '
                 + (e.innerText || '').slice(0, 40)),
        widgetViews: document.querySelectorAll("script[type='application/vnd.jupyter.widget-view+json']").length,
        widgetRoots: [...document.querySelectorAll('.jupyter-widgets')].filter(e =>
                 !e.parentElement.closest('.jupyter-widgets')).length,
        ownWidgets: [...document.querySelectorAll('.pt215-widget')].map(e => e.id),
      };
    }""")
    if facts["theme"] != scheme:
        problems.append(f"colour scheme not applied: {facts['theme']}")
    rgb = [int(x) for x in re.findall(r"\d+", facts["background"])[:3]] or [255, 255, 255]
    if (sum(rgb) / 3 < 128) != (scheme == "dark"):
        problems.append(f"the page's background {facts['background']} does not match the {scheme} scheme")
    if "Traceback (most recent call last)" in facts["text"] or facts["errorCells"]:
        problems.append("page shows a traceback or an error cell")
    if facts["broken"]:
        problems.append(f"images that did not load: {facts['broken']}")
    for f in facts["figures"]:
        if len(f["alt"].strip()) < 15 or PATH_LIKE.search(f["alt"].strip()) or f["alt"] == f["src"]:
            problems.append(f"figure without real alt text: {f['src']} alt={f['alt']!r}")
        if f["w"] > f["col"] + 1 and not f["scrolls"]:
            problems.append(f"figure wider than the text column: {f['src']} ({f['w']:.0f} > {f['col']:.0f} px)")
        if f["output"] and not re.match(r"Figure [\d.]+\. .{15,}(Tap|click).*full size", f["caption"], re.S):
            problems.append(f"figure without a number, a caption or the tap-to-enlarge hint: {f['src']}")
        if f["output"] and tab.width < 600 and f["natural"] and f["w"] / f["natural"] < PHONE_FIGURE_SCALE:
            problems.append(f"figure too small to read on a phone: {f['src']} ({f['w']:.0f} of {f['natural']} px)")
    if facts["wrapping"]:
        problems.append(f"{facts['wrapping']} outputs wrap their lines")
    if facts["skippedOutputs"]:
        problems.append(f"{facts['skippedOutputs']} '[skipped]' lines shown as outputs, not as notes")
    if facts["midWord"]:
        problems.append(f"code names broken inside a word: {facts['midWord'][:5]}")
    if tab.width < 992 and not facts["headerTitle"]:
        problems.append("no book title in the phone header")
    if facts["download"] != ["../" * path.count("/") + "_downloads/pytorch-2.15-in-practice.zip"]:
        problems.append(f"no (or a wrong) whole-book download link in the header: {facts['download']}")
    if len(facts["description"]) < 30 or not facts["preview"]:
        problems.append(f"no description or preview image for link previews: {facts['description']!r}")
    if facts["scrollW"] > facts["viewW"] + 1:
        problems.append(f"page is {facts['scrollW']} px wide in a {facts['viewW']} px viewport: {facts['wide']}")
    if facts["widgetRoots"] > facts["widgetViews"]:
        problems.append(f"{facts['widgetRoots']} widgets shown for {facts['widgetViews']} widget outputs")
    if len(set(facts["ownWidgets"])) != len(facts["ownWidgets"]):
        problems.append(f"a widget is shown twice: {facts['ownWidgets']}")
    for name in ("tex-mml-chtml.js", "searchindex.js"):  # math is SVG from the build; the index comes with search
        if any(urlparse(u).path.endswith(name) for u in tab.loaded):
            problems.append(f"{name} loaded on a page without search")
    for name in ("tex-mml-chtml.js", "embed-amd.js", "require.js"):
        n = sum(urlparse(u).path.endswith(name) for u in tab.loaded)
        if n > 1:
            problems.append(f"{name} loaded {n} times")
    if any(urlparse(u).path.endswith("tex-mml-chtml.js") for u in tab.loaded) and not (
            page.locator(".math").count() or "\\(" in facts["text"]):
        problems.append("MathJax loaded on a page without math")
    if any(urlparse(u).path.endswith("embed-amd.js") for u in tab.loaded) and not facts["widgetViews"]:
        problems.append("the widget manager loaded on a page without widgets")
    problems += [f"{e}" for e in tab.errors]
    return problems


def check_navigation(tab: Tab, width: int) -> list[str]:
    """The visible ☰ opens the table of contents (phone) or collapses the sidebar (laptop); "On this page"
    opens the page's contents on a phone."""
    page, problems = tab.page, []
    toggle = page.locator(".primary-toggle:visible")
    if toggle.count() != 1:
        return [f"{toggle.count()} visible ☰ buttons"]
    if width < 992:
        toggle.click()
        modal = page.locator("#pst-primary-sidebar-modal")
        links = page.locator("#pst-primary-sidebar-modal .bd-links a:visible")
        if not modal.evaluate("d => d.open") or not links.count():
            problems.append("☰ did not open the table of contents")
        page.keyboard.press("Escape")
        secondary = page.locator(".secondary-toggle:visible")
        if secondary.count():
            secondary.first.click()
            if not page.locator("#pst-secondary-sidebar-modal").evaluate("d => d.open") or not page.locator(
                    "#pst-secondary-sidebar-modal a:visible").count():
                problems.append('"On this page" did not open the page contents')
            page.keyboard.press("Escape")
    else:
        sidebar = page.locator("#pst-primary-sidebar")
        if not sidebar.is_visible():
            return ["the sidebar is not shown on a laptop"]
        # the theme animates the change for 0.25 s; the check is where the sidebar ends up, so the animation is
        # switched off on this tab's page (the page's own CSS still decides the end state)
        page.add_style_tag(content="#pst-primary-sidebar { transition: none !important; }")
        for state, what in (("hidden", "collapse the sidebar"), ("visible", "bring the sidebar back")):
            toggle.click()
            try:
                sidebar.wait_for(state=state, timeout=3000)
            except Exception:
                problems.append(f"☰ did not {what}")
    return problems


def test_site_has_pages():
    assert "intro.html" in PAGES or "index.html" in PAGES
    assert any(p.startswith("chapters/") for p in PAGES)


@pytest.mark.site
@pytest.mark.parametrize("page_path", PAGES)
def test_page(tabs, page_path):
    # every page once per width: checked in light with its navigation, then switched to dark in place and
    # checked again (the same layout, other colours)
    problems = []
    for (width, _h, _scheme), tab in tabs.items():
        page = open_page(tab, page_path)
        found = [f"[{width} px, light] {p}" for p in inspect(tab, page, page_path, "light")]
        found += [f"[{width} px, light] {p}" for p in check_navigation(tab, width)]
        errors_before = len(tab.errors)
        switch_scheme(page, "dark")
        dark = inspect(tab, page, page_path, "dark")
        found += [f"[{width} px, dark] {p}" for p in dark if p not in tab.errors[:errors_before]]
        problems += found
    assert not problems, "\n".join(problems)


@pytest.mark.site
def test_first_visit_weight(tabs):
    """Landing page under budget on a first visit (empty cache); every page's weight recorded."""
    for path in PAGES:  # measured by test_page already, unless it was deselected
        if path not in WEIGHTS:
            tabs[FIRST_VISIT].open(path)
    weights = {p: WEIGHTS[p] for p in PAGES}
    (SITE.parent / "site-weights.json").write_text(json.dumps(weights, indent=1, sort_keys=True))
    heaviest = max(weights, key=weights.get)
    landing = weights.get("intro.html", weights.get("index.html", 0))
    print(f"\nfirst visit: landing {landing / 1e6:.2f} MB; heaviest {heaviest} {weights[heaviest] / 1e6:.2f} MB")
    assert landing <= LANDING_BUDGET, f"landing page weighs {landing} bytes on a first visit"
    assert weights[heaviest] <= PAGE_BUDGET, f"{heaviest} weighs {weights[heaviest]} bytes on a first visit"


def widget_out(page, wid: str) -> str:
    return page.inner_text(f"#{wid} [aria-live]")


@pytest.mark.site
def test_widgets_change_what_they_say(tabs):
    """Every browser-side widget reacts to input with no kernel; the two of the book give the right numbers."""
    tab = tabs[(390, 844, "light")]
    seen = 0
    for path in PAGES:
        if "pt215-widget" not in (SITE / path).read_text(encoding="utf-8"):
            continue
        page = tab.open(path)
        for wid in page.evaluate("() => [...document.querySelectorAll('.pt215-widget')].map(e => e.id)"):
            seen += 1
            before = widget_out(page, wid)
            rng, sel = page.locator(f"#{wid} input[type=range]"), page.locator(f"#{wid} select")
            presets = page.locator(f"#{wid} button[data-preset]")
            if presets.count():  # chapter 4's reduce-scatter calculator: presets, then typed inputs
                for k in range(presets.count()):
                    name = presets.nth(k).get_attribute("data-preset")
                    presets.nth(k).click()
                    printed = page.evaluate("""name => {
                      for (const pre of document.querySelectorAll('.cell_output pre')) {
                        const t = pre.innerText, i = t.indexOf('--- preset: ' + name + '\\n');
                        if (i >= 0) return t.slice(i).split('\\n').slice(1, 4).join('\\n'); } return null; }""", name)
                    if printed is not None:
                        assert widget_out(page, wid).strip() == printed.strip(), f"{path}: preset {name} differs"
                numbers = page.locator(f"#{wid} input[type=number]")
                numbers.nth(0).fill("7e9")
                assert "fp32 adds:" in widget_out(page, wid), widget_out(page, wid)
                numbers.nth(1).fill("0")
                assert "ValueError" in widget_out(page, wid)
                continue
            if page.locator(f"#{wid}-model").count():  # chapter 5's decode calculator: the page's Python prints
                printed = page.evaluate("""() => [...document.querySelectorAll('.cell_output pre')]
                  .map(p => p.innerText).join('\\n')""")
                for model in ("Llama-3 8B", "Llama-3 70B"):
                    for fmt in ("bf16", "nvfp4"):
                        page.locator(f"#{wid}-model").select_option(model)
                        page.locator(f"#{wid}-fmt").select_option(fmt)
                        got = re.search(r"([\d.]+) tokens/s in all", widget_out(page, wid))
                        want = re.search(rf"{re.escape(model)}\s+{fmt}\s+weights\s+[\d.]+ GB:\s+([\d.]+) tokens/s",
                                         printed)
                        assert got and want, (path, model, fmt, widget_out(page, wid))
                        assert round(float(want.group(1))) == int(got.group(1)), (path, model, fmt)
                page.locator(f"#{wid}-frac").fill("0")
                assert "ValueError" in widget_out(page, wid)
                continue
            if rng.count():
                for n in (2, 3, 7, 32, 64):
                    rng.fill(str(n))
                    assert widget_out(page, wid) == f"2(n-1)/n = {2 * (n - 1) / n:.3f}", (path, n)
            if sel.count():
                options = sel.evaluate("s => [...s.options].map(o => o.value)")
                for name in options:
                    sel.select_option(name)
                    table = widget_out(page, wid)
                    # The page prints the same table from Python for some presets ("--- preset: NAME").
                    printed = page.evaluate("""name => {
                      for (const pre of document.querySelectorAll('.cell_output pre')) {
                        const t = pre.innerText, i = t.indexOf('--- preset: ' + name + '\\n');
                        if (i >= 0) return t.slice(i).split('\\n').slice(1, 20).join('\\n'); } return null; }""", name)
                    if printed is not None:
                        assert table.strip() == printed.strip(), f"{path}: preset {name} differs from Python's table"
                box = page.locator(f"#{wid} textarea")
                box.fill(", ".join(["1"] * 15 + ["-6"]))
                assert "relative error" in widget_out(page, wid) and widget_out(page, wid) != table
                box.fill("1, 2")
                assert "need exactly 16 values, got 2" in widget_out(page, wid)
            assert widget_out(page, wid) != before or rng.count(), f"{path}: widget {wid} never changed"
        assert not tab.errors, tab.errors
    assert seen >= 3, "expected the book's widgets (chapter 0 slider, chapter 4 calculator, chapter 5 explorer)"


@pytest.mark.site
def test_notebook_pages_offer_download_and_launch(tabs):
    page = tabs[(1366, 900, "light")].open("chapters/00-before-you-start/00-1-environment.html")
    hrefs = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)")
    ipynb = [h for h in hrefs if h.endswith(".ipynb") and "127.0.0.1" in h]
    assert ipynb, "no .ipynb download link"
    assert page.request.get(ipynb[0]).status == 200
    from pt215.site.config import read_book_config

    launch = bool(read_book_config(ROOT).repository_url)  # no repository URL: no button that points nowhere
    assert any("colab.research.google.com" in h for h in hrefs) == launch
    assert any("mybinder.org" in h for h in hrefs) == launch


@pytest.mark.site
def test_search_finds_pages(tabs):
    """Results quote the matching text, not the page's title, print-only contents or hidden setup code."""
    page = tabs[(1366, 900, "light")].open("search.html?q=busbw")
    page.wait_for_selector("#search-results li p.context", timeout=20000)
    assert page.locator("#search-results li").count() >= 1
    snippets = page.eval_on_selector_all("#search-results li p.context", "ps => ps.map(p => p.innerText)")
    assert snippets and all("busbw" in s.lower() for s in snippets[:3]), snippets[:3]
    assert not any(w in s for s in snippets for w in ("Contents", "Show code cell", "# Setup")), snippets
    assert not (SITE / "genindex.html").exists() or "genindex" not in (SITE / "intro.html").read_text(), "empty index"


@pytest.mark.site
def test_search_field_draws_its_icon_beside_the_text(tabs):
    page = tabs[(1366, 900, "light")].open("search.html?q=busbw")
    field = page.locator("article form.bd-search, .bd-search-container form.bd-search").first
    icon, box = field.locator(".fa-magnifying-glass").bounding_box(), field.locator("input").bounding_box()
    assert icon and box and icon["width"] > 4 and icon["x"] + icon["width"] <= box["x"] + 1, (icon, box)
    assert page.evaluate("() => Search.hasIndex()")
    intro = tabs[(1366, 900, "light")].open("intro.html")  # elsewhere the index loads when a search field is used
    assert not intro.evaluate("() => Search.hasIndex()")
    intro.keyboard.press("Control+k")
    intro.wait_for_function("() => Search.hasIndex()", timeout=10000)


@pytest.mark.site
def test_first_visit_logs_no_console_error(browser, server):
    """A visitor with nothing stored (no colour mode chosen yet) gets no console error either."""
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page, errors = ctx.new_page(), []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    for path in ("intro.html", "chapters/02-flight-recorder/02-3-diagnosis.html"):
        page.goto(f"{server}/{path}", wait_until="load")
        page.wait_for_timeout(300)
    ctx.close()
    assert not errors, errors


@pytest.mark.site
def test_whole_book_download_is_served(tabs):
    page = tabs[(1366, 900, "light")].open("intro.html")
    href = page.eval_on_selector("a.pt215-download", "a => a.href")
    resp = page.request.get(href)
    assert resp.status == 200 and resp.body()[:2] == b"PK" and len(resp.body()) > 1_000_000


@pytest.mark.site
def test_dark_mode_switch(tabs):
    page = tabs[(1366, 900, "light")].open("intro.html")
    seen = {page.evaluate("() => document.documentElement.dataset.theme")}
    for _ in range(3):
        page.locator(".theme-switch-button:visible").first.click()
        seen.add(page.evaluate("() => document.documentElement.dataset.theme"))
    assert "dark" in seen and "light" in seen
    page.evaluate("() => { localStorage.setItem('mode', 'light'); localStorage.setItem('theme', 'light'); }")


@pytest.mark.site
def test_chapter_pages_show_badge_and_stamp(tabs):
    page = tabs[(1366, 900, "light")].open("chapters/00-before-you-start/00-1-environment.html")
    assert "Hardware:" in page.inner_text(".pt215-needs")
    assert "Last verified: torch 2.15.0" in page.inner_text(".pt215-verified")
    for path in PAGES:  # a chapter page whose notebooks agree shows one stamp, not one per notebook
        if path.endswith("index.html") and path.startswith("chapters/"):
            body = (SITE / path).read_text(encoding="utf-8")
            m = re.search(r'<span class="pt215-badge pt215-verified"[^>]*>(.*?)</span>', body, re.S)
            if m and "<br>" in m.group(1):
                lines = [re.sub(r"^.*?: ", "", s) for s in m.group(1).split("<br>")]
                assert len(set(lines)) > 1, f"{path} repeats one stamp per notebook"


def _names_the_same_page(text: str, label: str) -> bool:
    """A link in a chapter page names a notebook as the sidebar does, by its number in prose ("notebook 3.1"), or by
    the sidebar's label shortened at a colon ("8.1 What a pipeline rank holds")."""
    number = label.split(" ", 1)[0]
    if re.fullmatch(rf"(?i)(notebook )?{re.escape(number)}", text):
        return True
    return text == label or (text.startswith(number + " ") and label.startswith(text + ":"))


def test_one_label_style():
    """Chapters are "N. Title" and notebooks "N.M Title" in the sidebar, and the landing page and chapter tables
    use the same labels as the sidebar."""
    if not (SITE / "intro.html").is_file():
        pytest.skip("the website is not built")
    html = (SITE / "intro.html").read_text(encoding="utf-8")
    nav = html[html.index('class="bd-links'):]
    nav = nav[:nav.index("</nav>")]
    tag = re.compile(r"<[^>]+>")
    labels = {}
    for href, text in re.findall(r'<a class="reference internal" href="([^"#]+)">(.*?)</a>', nav, re.S):
        labels[href] = " ".join(tag.sub("", text).split())
    bad = []
    for href, text in labels.items():
        name = href.rsplit("/", 1)[-1]
        if re.fullmatch(r"chapters/\d\d-[^/]+/index\.html", href) and not re.match(r"\d+\. \S", text):
            bad.append(f"chapter label {text!r} ({href}) is not 'N. Title'")
        if href.startswith("chapters/") and name[:1].isdigit() and not re.match(r"\d+\.\d+ \S", text):
            bad.append(f"notebook label {text!r} ({href}) is not 'N.M Title'")
    body = html[html.index('<article class="bd-article">'):]
    for href, text in re.findall(r'<a class="reference internal" href="([^"#]+)">(.*?)</a>', body, re.S):
        text = " ".join(tag.sub("", text).split())
        if href in labels and re.match(r"\d", text) and text != labels[href]:
            bad.append(f"landing page says {text!r} where the sidebar says {labels[href]!r}")
    for path in PAGES:
        if not re.fullmatch(r"chapters/\d\d-[^/]+/index\.html", path):
            continue
        page = (SITE / path).read_text(encoding="utf-8")
        art = page[page.index('<article class="bd-article">'):]
        for href, text in re.findall(r'<a class="reference internal" href="(\d\d[^"#/]*\.html)">(.*?)</a>', art, re.S):
            text, key = " ".join(tag.sub("", text).split()), path.rsplit("/", 1)[0] + "/" + href
            if key in labels and not _names_the_same_page(text, labels[key]):
                bad.append(f"{path} says {text!r} where the sidebar says {labels[key]!r}")
    assert not bad, "\n".join(bad)


def test_layout_override_matches_installed_theme():
    """_templates/layout.html is the theme's `extrahead` block minus searchindex.js (loaded with search instead)."""
    import pydata_sphinx_theme

    theirs = (Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "layout.html").read_text()
    ours = (ROOT / "_templates" / "layout.html").read_text(encoding="utf-8")

    def block(text: str) -> list[str]:
        body = text[text.index("{%- block extrahead %}"):text.index("{%- endblock extrahead %}")]
        return [line.strip() for line in body.splitlines() if line.strip() and "searchindex.js" not in line]

    assert block(ours) == block(theirs)


def test_theme_macros_override_matches_installed_theme():
    """_templates/static/webpack-macros.html is the theme's own file minus fontawesome.js: same assets, same digest."""
    import pydata_sphinx_theme

    theirs = (Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static"
              / "webpack-macros.html").read_text(encoding="utf-8")
    ours = (ROOT / "_templates" / "static" / "webpack-macros.html").read_text(encoding="utf-8")
    asset = re.compile(r"pathto\('([^']+)', 1\) \}\}\?digest=(\w+)")
    assert set(asset.findall(ours)) == {a for a in asset.findall(theirs) if "fontawesome" not in a[0]}
