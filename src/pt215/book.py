"""Sphinx extension for the book's website: a hardware badge and a "last verified" stamp on chapter pages.

Both come from files, never typed into a page by hand:
- the badge from the `pt215.needs` key in a page's front matter (notebook sources and chapter `index.md`);
- the stamp from the `pt215.verified` metadata that `scripts/regen.py` writes into each `.ipynb` when it
  produces the reference outputs (torch version, hardware, date). A chapter's text page shows the stamps of
  its notebooks. Used by every chapter page (see chapter 0, "Before you start").
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["setup", "page_stamp", "read_front_matter"]

_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)
# An empty plain-text output: the placeholder pt215.launch shows live output in (emptied when the run ends).
_EMPTY_OUTPUT = re.compile(
    r'<div class="output text_plain[^"]*"><div class="highlight"><pre><span></span>\s*</pre></div>\s*</div>\s*')


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


def _fmt_verified(v: dict[str, Any]) -> str:
    return f"torch {v.get('torch', '?')} · {v.get('hardware', '?')} · {v.get('date', '?')}"


def page_stamp(srcdir: Path, pagename: str) -> tuple[str | None, list[str]]:
    """(needs text, verified stamps) for a page of the book, or (None, []) for pages outside chapters."""
    if not pagename.startswith("chapters/"):
        return None, []
    base = srcdir / pagename
    chapter = base.parent
    needs: str | None = None
    stamps: list[str] = []
    if base.with_suffix(".ipynb").is_file():
        meta = _notebook_meta(base.with_suffix(".ipynb"))
        needs = meta.get("needs")
        if meta.get("verified"):
            stamps.append(_fmt_verified(meta["verified"]))
    elif base.with_suffix(".md").is_file():
        needs = (read_front_matter(base.with_suffix(".md")).get("pt215") or {}).get("needs")
        for nb in sorted(chapter.glob("[0-9]*.ipynb")):
            meta = _notebook_meta(nb)
            if meta.get("verified"):
                stamps.append(f"{nb.stem}: " + _fmt_verified(meta["verified"]))
    return needs, stamps


def _badge_html(needs: str | None, stamps: list[str]) -> str:
    parts = []
    if needs:
        parts.append(f'<span class="pt215-badge pt215-needs" title="What this page needs">'
                     f"Hardware: {html.escape(str(needs))}</span>")
    if stamps:
        if len(stamps) == 1:
            body = html.escape(stamps[0])
        else:
            body = "<br>".join(html.escape(s) for s in stamps)
        parts.append(f'<span class="pt215-badge pt215-verified" title="Reference outputs produced by '
                     f'scripts/regen.py on this configuration">Last verified: {body}</span>')
    if not parts:
        return ""
    return '<div class="pt215-badges">' + "".join(parts) + "</div>"


def _on_page_context(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if "body" not in context:
        return
    context["body"] = _EMPTY_OUTPUT.sub("", context["body"])
    needs, stamps = page_stamp(Path(app.srcdir), pagename)
    badge = _badge_html(needs, stamps)
    if not badge:
        return
    body = context["body"]
    m = re.search(r"</h1>", body)
    context["body"] = body[: m.end()] + badge + body[m.end():] if m else badge + body


def setup(app) -> dict[str, Any]:
    app.connect("html-page-context", _on_page_context)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
