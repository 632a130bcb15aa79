"""The verdict tables: a chapter page's first screen says whether to adopt each feature; `{verdicts}` gathers them.

A chapter page (`chapters/NN-slug/index.md`) holds its verdict table under "## Why it matters", with the header

    | Feature | What it buys | What it costs or risks | Verdict | Rollback |

and one of `VERDICTS` in the Verdict column. The at-a-glance page shows every chapter's rows with `{verdicts}`,
read from the chapter pages at build time, so each verdict has one home (its chapter) and the summary cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HEADER", "VERDICTS", "Verdict", "read_verdicts", "setup", "verdict_map_svg", "verdict_table"]

HEADER = ("Feature", "What it buys", "What it costs or risks", "Verdict", "Rollback")
VERDICTS = ("adopt now", "test first", "leave alone")
_ROW = re.compile(r"^\|(.*)\|\s*$")


@dataclass(frozen=True)
class Verdict:
    """One row of a chapter's verdict table."""

    chapter: str
    feature: str
    buys: str
    costs: str
    verdict: str
    rollback: str


def _cells(line: str) -> list[str]:
    m = _ROW.match(line.strip())
    if not m:
        return []
    return [c.strip() for c in re.split(r"(?<!\\)\|", m.group(1))]


def read_verdicts(page: Path) -> list[Verdict]:
    """The verdict table of one chapter page; ValueError naming the page if it is missing or malformed."""
    lines = page.read_text(encoding="utf-8").splitlines()
    chapter = page.parent.name
    for i, line in enumerate(lines):
        if tuple(_cells(line)) == HEADER:
            rows: list[Verdict] = []
            for row in lines[i + 2:]:
                cells = _cells(row)
                if not cells:
                    break
                if len(cells) != len(HEADER):
                    raise ValueError(f"{page}: a verdict row needs {len(HEADER)} cells, got {len(cells)}: {row!r}")
                verdict = re.sub(r"[*_]", "", cells[3]).strip().lower()
                if verdict not in VERDICTS:
                    raise ValueError(f"{page}: verdict {cells[3]!r} is not one of {', '.join(VERDICTS)}")
                rows.append(Verdict(chapter, cells[0], cells[1], cells[2], verdict, cells[4]))
            if not rows:
                raise ValueError(f"{page}: the verdict table has no rows")
            return rows
    raise ValueError(f"{page}: no verdict table (a table headed | {' | '.join(HEADER)} |)")


def verdict_table(chapters: Path) -> str:
    """Every chapter's verdict rows as one MyST table, each with a link to its chapter page."""
    out = ["| Chapter | Feature | What it buys | Verdict | Rollback |", "|---|---|---|---|---|"]
    for page in sorted(chapters.glob("[0-9][0-9]-*/index.md")):
        number, folder = int(page.parent.name[:2]), page.parent.name
        for v in read_verdicts(page):
            feature, buys, rollback = (_rebase(c, folder) for c in (v.feature, v.buys, v.rollback))
            out.append(f"| [{number}]({folder}/index.md) | {feature} | {buys} | **{v.verdict}** | {rollback} |")
    return "\n".join(out)


_GLUE_PATH = re.compile(r"(\{glue(?::[a-z]+)?\}`)(?![^`]*/)")
_LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)]+)\)")


def _rebase(cell: str, folder: str) -> str:
    """A chapter page's cell as the at-a-glance page (one folder up) must say it: glue references and relative
    links get the chapter's folder in front (`../x` becomes `x`)."""

    def link(m: re.Match[str]) -> str:
        target = m.group(1)
        return f"]({target[3:]})" if target.startswith("../") else f"]({folder}/{target})"

    return _LINK.sub(link, _GLUE_PATH.sub(rf"\g<1>{folder}/", cell))


VERDICT_COLORS = {"adopt now": "#009E73", "test first": "#E69F00", "leave alone": "#999999"}
"""Okabe-Ito green, orange and grey (pt215.figures.COLORS), one per verdict."""


def _chapter_title(page: Path) -> str:
    """`N. Title` from a chapter page's first heading, cut at its first colon."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            title = re.sub(r"[`*]", "", line[2:]).split(":")[0].strip()
            return title if len(title) <= 48 else title[:47].rstrip() + "…"
    raise ValueError(f"{page}: no '# N. Title' heading")


def verdict_map_svg(chapters: Path) -> tuple[str, str, dict[str, int]]:
    """(SVG, alt text, verdict counts): one row per chapter, one square per feature coloured by its verdict,
    drawn from the chapter pages' verdict tables."""
    rows = [(_chapter_title(p), read_verdicts(p)) for p in sorted(chapters.glob("[0-9][0-9]-*/index.md"))]
    counts = {v: sum(r.verdict == v for _t, rs in rows for r in rs) for v in VERDICTS}
    size, gap, top, line = 26, 6, 58, 36
    most = max(len(rs) for _t, rs in rows)
    left = 52  # the chapter's number, then its squares, then its title
    title_x = left + most * (size + gap) + 10
    width = max(640, title_x + 10 * max(len(t) for t, _rs in rows))
    height = top + len(rows) * line + 10
    esc = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}

    def text(x: float, y: float, s: str, **kw: str) -> str:
        attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())
        return f'<text x="{x}" y="{y}"{attrs}>{"".join(esc.get(c, c) for c in s)}</text>'

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="18">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    x = 10
    for verdict in VERDICTS:
        out.append(f'<rect x="{x}" y="12" width="20" height="20" rx="3" fill="{VERDICT_COLORS[verdict]}"/>')
        out.append(text(x + 28, 29, f"{verdict} ({counts[verdict]})"))
        x += 40 + 11 * len(verdict) + 40
    for i, (title, verdicts) in enumerate(rows):
        y = top + i * line
        number, _, name = title.partition(" ")
        out.append(text(left - 10, y + size - 7, number, text_anchor="end"))
        out.append(text(title_x, y + size - 7, name))
        for j, v in enumerate(verdicts):
            out.append(f'<rect x="{left + j * (size + gap)}" y="{y}" width="{size}" height="{size}" rx="4" '
                       f'fill="{VERDICT_COLORS[v.verdict]}"><title>{"".join(esc.get(c, c) for c in v.feature)}: '
                       f'{v.verdict}</title></rect>')
    out.append("</svg>")
    total = sum(counts.values())
    alt = (f"A grid with one row per chapter and one square per 2.15 feature, coloured by the chapter's verdict: "
           f"{total} features, {counts['adopt now']} adopt now (green), {counts['test first']} test first "
           f"(orange), {counts['leave alone']} leave alone (grey).")
    return "\n".join(out), alt, counts


def setup(app) -> dict[str, Any]:
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList

    class Verdicts(Directive):
        """`{verdicts}`: the verdict tables of every chapter page, gathered."""

        has_content = False

        def run(self):
            env = self.state.document.settings.env
            chapters = Path(env.srcdir) / "chapters"
            try:
                table = verdict_table(chapters)
            except ValueError as e:
                raise self.error(str(e)) from None
            for page in sorted(chapters.glob("[0-9][0-9]-*/index.md")):
                env.note_dependency(str(page))
            from docutils import nodes

            container = nodes.container(classes=["pt215-verdicts"])
            self.state.nested_parse(StringList(table.splitlines(), source="verdicts"), self.content_offset,
                                    container)
            return [container]

    class VerdictMap(Directive):
        """`{verdict-map}` with the caption as content: every chapter's verdicts as one picture (verdict_map_svg)."""

        has_content = True

        def run(self):
            import hashlib

            from pt215.site.page_figures import figure_nodes

            env = self.state.document.settings.env
            chapters = Path(env.srcdir) / "chapters"
            try:
                svg, alt, _counts = verdict_map_svg(chapters)
            except ValueError as e:
                raise self.error(str(e)) from None
            for page in sorted(chapters.glob("[0-9][0-9]-*/index.md")):
                env.note_dependency(str(page))
            if not self.content:
                raise self.error("verdict-map: give a caption (what to look at) as the directive's content")
            name = f"pt215-verdicts-{hashlib.sha256(svg.encode()).hexdigest()[:16]}.svg"
            images = Path(env.app.outdir) / "_images"
            images.mkdir(parents=True, exist_ok=True)
            (images / name).write_text(svg, encoding="utf-8")
            return figure_nodes(self.state, self.content, self.content_offset, name, alt)

    app.add_directive("verdicts", Verdicts)
    app.add_directive("verdict-map", VerdictMap)
    return {"parallel_read_safe": True}
