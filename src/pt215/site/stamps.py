"""A chapter page's hardware badge and "last verified" stamp, read from files, never typed into a page.

- the badge from the `pt215.needs` key in a page's front matter (notebook sources and chapter `index.md`);
- the stamp from the `pt215.verified` metadata that `scripts/regen.py` writes into each `.ipynb` when it
  produces the reference outputs (torch version, hardware, date). A chapter's text page shows the stamps of
  its notebooks: one line when torch and hardware agree (the dates become a range), else one line per notebook.

Used on every chapter page by the website's Sphinx extension (:mod:`pt215.site.extension`; chapter 0, "Before
you start").
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Stamp", "badge_html", "page_stamp", "read_front_matter", "stamp_line"]

_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)


@dataclass(frozen=True)
class Stamp:
    """One notebook's `pt215.verified` record: the configuration its reference outputs were produced on.
    `notebook` is the notebook's name on a chapter's text page, None on the notebook's own page."""

    notebook: str | None
    torch: str
    hardware: str
    date: str

    @classmethod
    def from_metadata(cls, verified: dict[str, Any], notebook: str | None = None) -> Stamp:
        """From a notebook's `metadata.pt215.verified` ("?" for a missing field)."""
        return cls(notebook, *(str(verified.get(k, "?")) for k in ("torch", "hardware", "date")))

    @property
    def configuration(self) -> str:
        """`torch 2.15.0 · CPU x86_64, 2 cores, no CUDA GPU` (without the date)."""
        return f"torch {self.torch} · {self.hardware}"

    def text(self) -> str:
        """`01-a: torch 2.15.0 · CPU x86_64, 2 cores, no CUDA GPU · 2026-11-29` (no name on a notebook's page)."""
        line = f"{self.configuration} · {self.date}"
        return f"{self.notebook}: {line}" if self.notebook else line


def read_front_matter(path: Path) -> dict[str, Any]:
    """YAML front matter of a MyST markdown file ({} when there is none)."""
    import yaml

    m = _FRONT.match(path.read_text(encoding="utf-8"))
    if not m:
        return {}
    data = yaml.safe_load(m.group(1)) or {}
    return data if isinstance(data, dict) else {}


def _notebook_meta(path: Path) -> dict[str, Any]:
    meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    return meta.get("pt215", {}) or {}


def page_stamp(srcdir: Path, pagename: str) -> tuple[str | None, list[Stamp]]:
    """(needs text, verified stamps) for a page of the book, or (None, []) for pages outside chapters."""
    if not pagename.startswith("chapters/"):
        return None, []
    base = srcdir / pagename
    needs: str | None = None
    stamps: list[Stamp] = []
    if base.with_suffix(".ipynb").is_file():
        meta = _notebook_meta(base.with_suffix(".ipynb"))
        needs = meta.get("needs")
        if meta.get("verified"):
            stamps.append(Stamp.from_metadata(meta["verified"]))
    elif base.with_suffix(".md").is_file():
        needs = (read_front_matter(base.with_suffix(".md")).get("pt215") or {}).get("needs")
        for nb in sorted(base.parent.glob("[0-9]*.ipynb")):
            meta = _notebook_meta(nb)
            if meta.get("verified"):
                stamps.append(Stamp.from_metadata(meta["verified"], nb.stem))
    return needs, stamps


def stamp_line(stamps: list[Stamp]) -> str | None:
    """One line for stamps that agree on torch and hardware (`torch · hardware · date`, the dates a range), else
    None (the page shows one line per notebook)."""
    if not stamps or len({s.configuration for s in stamps}) != 1:
        return None
    dates = sorted({s.date for s in stamps})
    return f"{stamps[0].configuration} · " + (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}")


def badge_html(needs: str | None, stamps: list[Stamp]) -> str:
    """The badges under a chapter page's title: what it needs, and when and where it was last verified."""
    parts = []
    if needs:
        parts.append(f'<span class="pt215-badge pt215-needs" title="What this page needs">'
                     f"Hardware: {html.escape(str(needs))}</span>")
    if stamps:
        line = stamp_line(stamps)
        body = html.escape(line) if line else "<br>".join(html.escape(s.text()) for s in stamps)
        parts.append(f'<span class="pt215-badge pt215-verified" title="Reference outputs produced by '
                     f'scripts/regen.py on this configuration">Last verified: {body}</span>')
    if not parts:
        return ""
    return '<div class="pt215-badges">' + "".join(parts) + "</div>"
