"""Print one handout per chapter: the built website's chapter page to PDF ("Running a workshop").

    .venv/bin/python scripts/print_handouts.py                  # every chapter, into _build/handouts/
    .venv/bin/python scripts/print_handouts.py --out DIR 02-flight-recorder workshop

Needs the website built (`jupyter-book build .`, README command 1) and Debian's chromium, the browser the site
test drives through Playwright. Each chapter's page (objectives, the idea, key points, exercises with their
solutions, troubleshooting) is opened in the light theme and printed on A4 with the browser's print styles,
which leave out the navigation bars; the workshop pages (agenda, email, participant checklist, notes, tracks)
print as `workshop-*.pdf`.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
WORKSHOP = ("index", "agenda", "email", "checklist", "notes", "tracks")


def pages(site: Path, only: list[str]) -> list[tuple[str, Path]]:
    """(PDF name, HTML page) for each chapter's index page and the workshop pages, filtered by `only`."""
    out = [(p.parent.name, p) for p in sorted(site.glob("chapters/[0-9]*/index.html"))]
    out += [(f"workshop-{name}", site / "chapters" / "workshop" / f"{name}.html") for name in WORKSHOP]
    out = [(n, p) for n, p in out if p.is_file()]
    if only:
        unknown = [o for o in only if not any(n == o or n.startswith(f"{o}-") or n.startswith(o) for n, _ in out)]
        if unknown:
            raise SystemExit(f"print_handouts.py: no built page for {', '.join(unknown)}; "
                             f"choose among {', '.join(n for n, _ in out)}")
        out = [(n, p) for n, p in out if any(n == o or n.startswith(o) for o in only)]
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request log on the terminal
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chapters", nargs="*", help="chapter folders (02-flight-recorder) or 'workshop'; default: all")
    p.add_argument("--site", type=Path, default=SITE, help="the built website (default _build/html)")
    p.add_argument("--out", type=Path, default=ROOT / "_build" / "handouts", help="folder for the PDFs")
    a = p.parse_args(argv)
    if not (a.site / "index.html").is_file():
        p.error(f"--site {a.site} has no index.html: build the website first (jupyter-book build .)")
    if not CHROMIUM.exists():
        p.error(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)")
    todo = pages(a.site, a.chapters)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(a.site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    a.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM),
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(color_scheme="light")
            for name, html in todo:
                page.goto(f"{base}/{html.relative_to(a.site).as_posix()}", wait_until="networkidle")
                page.emulate_media(media="print")
                target = a.out / f"{name}.pdf"
                page.pdf(path=str(target), format="A4", print_background=False,
                         margin={"top": "15mm", "bottom": "15mm", "left": "15mm", "right": "15mm"})
                print(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target.name}")
            browser.close()
    finally:
        httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
