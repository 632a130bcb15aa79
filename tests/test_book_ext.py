"""pt215.book: the hardware badge and "last verified" stamp come from files, not hand-typed text."""

from __future__ import annotations

import json
from pathlib import Path

from pt215.book import _badge_html, page_stamp, read_front_matter


def write_nb(path: Path, meta: dict) -> None:
    path.write_text(json.dumps({"cells": [], "metadata": {"pt215": meta}, "nbformat": 4, "nbformat_minor": 5}))


def test_page_stamps(tmp_path):
    ch = tmp_path / "chapters" / "09-x"
    ch.mkdir(parents=True)
    (ch / "index.md").write_text('---\npt215:\n  needs: "CPU: all"\n---\n# X\n')
    v = {"torch": "2.15.0", "hardware": "CPU x86_64, 2 cores, no CUDA GPU", "date": "2026-11-29"}
    write_nb(ch / "01-a.ipynb", {"needs": "CPU", "verified": v})
    assert read_front_matter(ch / "index.md") == {"pt215": {"needs": "CPU: all"}}
    needs, stamps = page_stamp(tmp_path, "chapters/09-x/index")
    assert needs == "CPU: all" and stamps == ["01-a: torch 2.15.0 · CPU x86_64, 2 cores, no CUDA GPU · 2026-11-29"]
    needs, stamps = page_stamp(tmp_path, "chapters/09-x/01-a")
    assert needs == "CPU" and len(stamps) == 1
    assert page_stamp(tmp_path, "intro") == (None, [])
    html = _badge_html("a < b", ["s"])
    assert "a &lt; b" in html and "Last verified: s" in html
    assert _badge_html(None, []) == ""


def test_empty_live_output_placeholders_are_dropped():
    from pt215.book import _EMPTY_OUTPUT

    head = '<div class="output text_plain highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>'
    empty = head + "\n</pre></div>\n</div>\n"
    full = head + "x\n</pre></div>\n</div>\n"
    assert _EMPTY_OUTPUT.sub("", empty + full) == full
