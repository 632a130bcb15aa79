"""What the website's Sphinx extension (:mod:`pt215.site.extension`) does to a page's rendered HTML, as plain functions.

- figures shown with `pt215.figures.show` become numbered figures with a visible caption (their alt text) and a
  note that a tap opens them full size;
- "[skipped] ..." lines printed by `pt215.hardware.requires` become a note (what the cell needs, what it shows on
  such a machine, values marked "~" labelled as expected), never an output;
- long inline code names may break only after "_", ".", "/", "::", "(", "[", "," or "=" (a `<wbr>`), never
  inside a word;
- a page's description (its first paragraph) for link previews.

Every page of the book goes through these when the site is built (see "Install and run", chapter 0).
"""

from __future__ import annotations

import html
import re

__all__ = ["break_names", "describe_page", "number_figures", "skipped_notes"]

_TAG = re.compile(r"<[^>]+>")
_FIGURE = re.compile(
    r'<a class="reference internal image-reference" href="(?P<href>[^"]+)">'
    r'(?P<img><img alt="(?P<alt>[^"]*)" src="[^"]+"(?: style="width: (?P<w>\d+)px;")? />)\s*</a>')


def number_figures(body: str, label: str) -> str:
    """Wrap each output figure in a `<figure>`: "Figure <label>.<k>", its alt text as the caption, and a hint that
    a tap (or click) opens the full-size image. `label` is the notebook's number ("2.3"), or "" for a plain count."""
    count = 0

    def one(m: re.Match[str]) -> str:
        nonlocal count
        if not m.group("alt").strip():
            return m.group(0)
        count += 1
        num = f"{label}.{count}" if label else str(count)
        width = f' style="--pt215-fig-w: {m.group("w")}px"' if m.group("w") else ""
        return (f'<figure class="pt215-figure" id="figure-{num.replace(".", "-")}"{width}>'
                f'<div class="pt215-figure-scroll"><a class="reference internal image-reference pt215-zoom" '
                f'href="{m.group("href")}" title="Open the figure full size">{m.group("img")}</a></div>'
                f'<figcaption><span class="pt215-fignum">Figure {num}.</span> {m.group("alt")} '
                f'<span class="pt215-zoom-hint">Tap or click the figure to open it full size.</span></figcaption>'
                f"</figure>")

    return _FIGURE.sub(one, body)


_OUTPUT = re.compile(
    r'<div class="output (?:stream|text_plain|stderr)[^"]*"><div class="highlight"><pre><span></span>'
    r"(?P<text>.*?)</pre></div>\s*</div>\s*", re.S)
_SKIPPED = re.compile(r"^\[skipped\] (?P<text>.+)$")
_PARTS = re.compile(r"^needs (?P<needs>.+?); (?P<has>.+?)\. This cell would have shown (?P<shows>.+?)\.?$")
_EXPECTED = re.compile(r"(~\s?[0-9][0-9.eE+\-]*(?:\s?%)?)")
_LABEL_EXPECTED = r"\1 (expected value)"


def _note(m: re.Match[str]) -> str:
    """The note for one skipped line (the page's "Last verified" stamp already says which hardware ran it)."""
    parts = _PARTS.match(m.group("text"))
    if parts is None:  # a line in another shape: shown whole, still as a note
        title, text = "Needs other hardware", _EXPECTED.sub(_LABEL_EXPECTED, m.group("text"))
    else:
        shows = _EXPECTED.sub(_LABEL_EXPECTED, parts.group("shows"))
        title, text = f'Needs {parts.group("needs")}', f"On such a machine this cell shows {shows}."
    return ('<div class="admonition note pt215-skipped" role="note"><p class="admonition-title">'
            f"{title}</p><p>{text}</p></div>\n")


def skipped_notes(body: str) -> str:
    """Turn the "[skipped] needs X; this machine has Y. This cell would have shown Z." lines of outputs into notes
    (the output keeps its other lines; an output left empty is dropped)."""

    def one(m: re.Match[str]) -> str:
        lines = m.group("text").split("\n")
        notes = [_SKIPPED.match(line) for line in lines]
        if not any(notes):
            return m.group(0)
        kept = [line for line, n in zip(lines, notes, strict=True) if not n]
        out = "".join(_note(n) for n in notes if n)
        if "".join(kept).strip():
            out += m.group(0).replace(m.group("text"), "\n".join(kept), 1)
        return out

    return _OUTPUT.sub(one, body)


_CODE = re.compile(r'(<span class="pre">)([^<]{16,})(</span>)')  # Sphinx's inline literals, one word each
_BREAK_AFTER = re.compile(r"(?<=[\w)\]])(::|[_./,=(\[])(?=[\w*(\['\"])")


def break_names(body: str) -> str:
    """Allow long inline code names (16+ characters) to break only after "_", ".", "/", "::", "(", "[", "," or
    "=" that follow a letter (`<wbr>`), never inside a word."""
    return _CODE.sub(lambda m: m.group(1) + _BREAK_AFTER.sub(r"\1<wbr>", m.group(2)) + m.group(3), body)


_PARA = re.compile(r"<p>(.*?)</p>", re.S)


def describe_page(body: str, limit: int = 200) -> str:
    """The page's first real paragraph as plain text, cut at a word within `limit` characters ('' if none)."""
    for m in _PARA.finditer(body):
        text = " ".join(html.unescape(_TAG.sub("", m.group(1))).split())
        if len(text) >= 40:
            if len(text) <= limit:
                return text
            return text[: text.rfind(" ", 0, limit - 1)].rstrip(",;:") + "…"
    return ""
