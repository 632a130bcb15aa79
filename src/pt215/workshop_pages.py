"""Sphinx directives of the "Running a workshop" part: tables generated from the notebooks and measurements.

- `workshop-agenda` (option `:cut: day` or `half`): the timetable `pt215.agenda.schedule` builds from each
  notebook's recorded run time, so the agenda page holds no typed-in minutes;
- `workshop-hub-sizing`: processes, cores, memory and disk per chapter, from `data/workshop/hub-sizing.json`
  (written by `scripts/measure_hub_sizing.py`).

Registered by `pt215.book.setup`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx import addnodes

from pt215.agenda import CUTS, Row, read_notebooks, schedule

__all__ = ["register"]

HUB_SIZING = "data/workshop/hub-sizing.json"
_KIND = {"live": "run live", "read": "walk through", "chapter": "objectives", "later": "self-study"}


def _inline(text: str) -> list[nodes.Node]:
    """Text with `code` spans as literals."""
    out: list[nodes.Node] = []
    for i, part in enumerate(re.split(r"`([^`]*)`", text)):
        if part:
            out.append(nodes.literal(part, part) if i % 2 else nodes.Text(part))
    return out


def _doc_link(doc: str, title: str) -> nodes.Node:
    ref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/" + doc, refexplicit=True,
                                refwarn=True)
    ref += nodes.inline("", "", *_inline(title))
    return ref


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], widths: Sequence[int]) -> nodes.table:
    table = nodes.table(classes=["pt215-workshop-table"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for w in widths:
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for h in headers:
        row += nodes.entry("", nodes.paragraph("", h))
    head += row
    body = nodes.tbody()
    group += body
    for values in rows:
        row = nodes.row()
        for v in values:
            para = nodes.paragraph()
            if isinstance(v, nodes.Node):
                para += v
            else:
                para += nodes.Text(str(v))
            row += nodes.entry("", para)
        body += row
    return table


def _agenda_row(r: Row) -> list[Any]:
    if r.kind in ("break", "lunch"):
        return [r.clock, str(r.minutes), nodes.emphasis("", r.title), "", ""]
    run = f"{r.seconds:.0f} s" if r.seconds is not None else ""
    if r.kind == "chapter":
        run = ""
    return [r.clock if r.kind != "later" else "", str(r.minutes), _doc_link(r.doc, r.title), _KIND[r.kind], run]


class AgendaDirective(Directive):
    """`workshop-agenda` with `:cut: day|half`."""

    has_content = False
    option_spec = {"cut": lambda arg: directives.choice(arg, tuple(CUTS))}

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        root = Path(env.srcdir)
        chapters = read_notebooks(root)
        for ch in chapters:
            for nb in ch.notebooks:
                env.note_dependency(str(root / f"{nb.doc}.ipynb"))
        s = schedule(chapters, self.options.get("cut", "day"))
        n = sum(len(ch.notebooks) for ch in chapters)
        summary = (f"{n} notebooks in {len(chapters)} chapters: {s.count('live')} run live, {s.count('read')} "
                   f"walked through from the stored outputs"
                   + (f", {s.count('later')} for self-study afterwards" if s.later else "")
                   + f". Ends at {s.end_clock}.")
        if not s.fits:
            summary += " This is later than planned: start earlier or move a chapter to a second session."
        out: list[nodes.Node] = [nodes.paragraph("", summary)]
        headers = ["start", "min", "what", "how", "notebook run time"]
        out.append(_table(headers, [_agenda_row(r) for r in s.rows], [8, 6, 60, 14, 12]))
        if s.later:
            out.append(nodes.paragraph("", "", nodes.strong("", "After the workshop (self-study)")))
            out.append(_table(headers, [_agenda_row(r) for r in s.later], [8, 6, 60, 14, 12]))
        for note in s.notes:
            out.append(nodes.paragraph("", note))
        return out


def _mib(x: float) -> str:
    return f"{x / 1024:.1f} GiB" if x >= 1024 else f"{x:.0f} MiB"


class HubSizingDirective(Directive):
    """`workshop-hub-sizing`: the measured needs per chapter and per notebook."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        path = Path(env.srcdir) / HUB_SIZING
        env.note_dependency(str(path))
        if not path.is_file():
            raise self.error(f"{HUB_SIZING} not found: run scripts/measure_hub_sizing.py")
        data = json.loads(path.read_text(encoding="utf-8"))
        prov, rows = data["provenance"], data["notebooks"]
        chapters: dict[str, list[dict]] = {}
        for r in rows:
            chapters.setdefault(r["chapter"], []).append(r)
        per_chapter = []
        for name, rs in sorted(chapters.items()):
            per_chapter.append([
                name,
                str(max(r["peak_processes"] for r in rs)),
                f"{max(r['peak_cores'] for r in rs):.1f}",
                _mib(max(r["peak_rss_mib"] for r in rs)),
                _mib(max(r["peak_scratch_mib"] + r["written_to_chapter_mib"] for r in rs)),
                f"{sum(r['wall_s'] for r in rs) / 60:.1f}",
            ])
        headers = ["chapter", "processes (peak)", "busy cores (peak)", "memory (peak)", "disk written (peak)",
                   "minutes to run all"]
        out: list[nodes.Node] = [nodes.paragraph("", (
            f"Measured on {prov['date']} with torch {prov['torch']}, Python {prov['python']}, on "
            f"{prov['cpu']} ({prov['cores']} cores, {prov['memory_gib']} GiB), sampling every "
            f"{prov['interval_s']} s; reproduce with `{prov['command']}`."))]
        top = max(rows, key=lambda r: r["peak_rss_mib"])
        out.append(nodes.paragraph("", (
            f"One participant, one notebook at a time: at most {max(r['peak_processes'] for r in rows)} "
            f"processes, {max(r['peak_cores'] for r in rows):.1f} busy cores and {_mib(top['peak_rss_mib'])} "
            f"of memory (the largest: {Path(top['notebook']).stem}).")))
        out.append(_table(headers, per_chapter, [22, 10, 10, 10, 10, 10]))
        per_nb = [[_doc_link(r["notebook"].removesuffix(".ipynb"), Path(r["notebook"]).stem),
                   str(r["peak_processes"]), f"{r['peak_cores']:.1f}", _mib(r["peak_rss_mib"]),
                   f"{r['wall_s']:.0f} s"] for r in rows]
        out.append(nodes.paragraph("", "", nodes.strong("", "Per notebook")))
        out.append(_table(["notebook", "processes", "busy cores", "memory", "run time"], per_nb,
                          [30, 10, 10, 10, 10]))
        return out


def register(app) -> None:
    """Add the workshop directives to a Sphinx app (called from `pt215.book.setup`)."""
    app.add_directive("workshop-agenda", AgendaDirective)
    app.add_directive("workshop-hub-sizing", HubSizingDirective)
