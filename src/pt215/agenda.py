"""The workshop agenda, generated from the notebooks ("Running a workshop", agenda page).

`read_notebooks(root)` reads each chapter notebook's recorded execution time (`pt215.verified.seconds`, written
by `scripts/regen.py`), its title and how much there is to read; `schedule(chapters, cut)` is a pure function
that turns them into a one-day or half-day timetable with breaks, deciding which notebooks participants run
live and which the facilitator walks through from the stored outputs. The `workshop-agenda` directive
(registered by `pt215.book`) renders it, so the agenda changes when a notebook or its timing does.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CUTS", "Chapter", "Notebook", "Row", "Schedule", "minutes", "read_notebooks", "schedule"]

PROSE_WPM = 150          # reading speed for technical prose
CODE_CELL_MIN = 0.5      # reading one code cell and its output
LIVE_EXTRA_MIN = 5       # a live notebook: questions while it runs, trying a change
READ_FACTOR = 0.5        # a walk-through from the stored outputs covers the text in half the time
READ_EXTRA_MIN = 3       # a walk-through: one discussion question
CHAPTER_MIN = 5          # a chapter's objectives and its hardware line, from its index page
BLOCK_SLACK_MIN = 10     # a block may overrun its nominal end by this much before a break
DEFAULT_SECONDS = 120.0  # run time assumed for a notebook not yet verified by scripts/regen.py
ROUND_MIN = 5


@dataclass(frozen=True)
class Notebook:
    """One chapter notebook: page name (`chapters/02-flight-recorder/02-1-recorder`), title, size and run time."""

    doc: str
    title: str
    seconds: float | None
    prose_words: int
    code_cells: int


@dataclass(frozen=True)
class Chapter:
    doc: str
    title: str
    notebooks: tuple[Notebook, ...]


@dataclass(frozen=True)
class Cut:
    """A workshop length: blocks of teaching time (start, end in minutes after midnight) and the breaks between."""

    name: str
    blocks: tuple[tuple[int, int], ...]
    breaks: tuple[str, ...]  # the name of the break after each block but the last


CUTS = {
    "day": Cut("day", ((540, 630), (645, 750), (810, 900), (915, 1020)), ("Break", "Lunch", "Break")),
    "half": Cut("half", ((540, 630), (645, 750)), ("Break",)),
}


@dataclass(frozen=True)
class Row:
    start: int
    minutes: int
    kind: str      # "chapter", "live", "read", "break", "lunch"; "later" for self-study after the workshop
    title: str
    doc: str = ""
    seconds: float | None = None

    @property
    def clock(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}"


@dataclass(frozen=True)
class Schedule:
    cut: str
    rows: tuple[Row, ...]
    end: int
    fits: bool
    planned_end: int = 0
    later: tuple[Row, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def end_clock(self) -> str:
        return f"{self.end // 60:02d}:{self.end % 60:02d}"

    def count(self, kind: str) -> int:
        return sum(r.kind == kind for r in self.rows + self.later)


def _round(x: float) -> int:
    return max(ROUND_MIN, ROUND_MIN * math.ceil(x / ROUND_MIN - 1e-9))


def minutes(nb: Notebook, live: bool) -> int:
    """Minutes a notebook takes in the room: run live (reading + recorded run time + questions) or walked through."""
    reading = nb.prose_words / PROSE_WPM + nb.code_cells * CODE_CELL_MIN
    if live:
        run = (nb.seconds if nb.seconds is not None else DEFAULT_SECONDS) / 60
        return _round(reading + run + LIVE_EXTRA_MIN)
    return _round(reading * READ_FACTOR + READ_EXTRA_MIN)


def _lay_out(chapters: tuple[Chapter, ...], mode: dict[str, str], cut: Cut) -> tuple[list[Row], list[Row], int]:
    rows: list[Row] = []
    later: list[Row] = []
    t = cut.blocks[0][0]
    block = 0
    items: list[tuple[str, int, str, str, float | None]] = []
    for ch in chapters:
        if all(mode[nb.doc] == "later" for nb in ch.notebooks):
            later.extend(Row(0, minutes(nb, True), "later", nb.title, nb.doc, nb.seconds) for nb in ch.notebooks)
            continue
        items.append(("chapter", CHAPTER_MIN, ch.title, ch.doc, None))
        for nb in ch.notebooks:
            if mode[nb.doc] == "later":
                later.append(Row(0, minutes(nb, True), "later", nb.title, nb.doc, nb.seconds))
            else:
                items.append((mode[nb.doc], minutes(nb, mode[nb.doc] == "live"), nb.title, nb.doc, nb.seconds))
    for kind, mins, title, doc, secs in items:
        while block < len(cut.blocks) - 1 and t + mins > cut.blocks[block][1] + BLOCK_SLACK_MIN:
            pause = cut.blocks[block + 1][0] - cut.blocks[block][1]
            name = cut.breaks[block]
            rows.append(Row(t, pause, "lunch" if name == "Lunch" else "break", name))
            t += pause
            block += 1
        rows.append(Row(t, mins, kind, title, doc, secs))
        t += mins
    return rows, later, t


def schedule(chapters: list[Chapter] | tuple[Chapter, ...], cut: str = "day") -> Schedule:
    """Timetable for `cut` ("day" or "half") that places every notebook of `chapters`, in book order.

    Every notebook starts live (participants run it). While the cut overruns, notebooks are downgraded one at
    a time, in this order: a chapter's later notebooks become walk-throughs (the one saving the most time
    first), then they move to self-study after the workshop (`Schedule.later`, longest first), then each
    chapter's first notebook does the same. A notebook is never dropped: it is in the room or in `later`.
    """
    if cut not in CUTS:
        raise ValueError(f"schedule(): cut must be one of {', '.join(CUTS)}; got {cut!r}")
    chapters = tuple(chapters)
    if not chapters or not all(isinstance(c, Chapter) and c.notebooks for c in chapters):
        raise ValueError("schedule(): chapters must be a non-empty list of Chapter with notebooks "
                         "(see read_notebooks)")
    spec = CUTS[cut]
    planned_end = spec.blocks[-1][1]
    firsts = {ch.notebooks[0].doc for ch in chapters}
    every = [nb for ch in chapters for nb in ch.notebooks]
    mode = {nb.doc: "live" for nb in every}
    stages = [(False, "live", "read", lambda nb: minutes(nb, True) - minutes(nb, False)),
              (False, "read", "later", lambda nb: minutes(nb, False)),
              (True, "live", "read", lambda nb: minutes(nb, True) - minutes(nb, False)),
              (True, "read", "later", lambda nb: minutes(nb, False))]
    rows, later, end = _lay_out(chapters, mode, spec)
    for first, old, new, gain in stages:
        while end > planned_end:
            pool = [nb for nb in every if (nb.doc in firsts) == first and mode[nb.doc] == old]
            if not pool:
                break
            # the biggest gain first; among equals, the later notebook in the book
            best = max(pool, key=lambda nb: (gain(nb), every.index(nb)))
            mode[best.doc] = new
            rows, later, end = _lay_out(chapters, mode, spec)
    notes = tuple(f"{nb.doc}: not yet verified, run time assumed {DEFAULT_SECONDS:g} s"
                  for nb in every if nb.seconds is None)
    return Schedule(cut, tuple(rows), end, end <= planned_end, planned_end, tuple(later), notes)


_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.M)


def _title(text: str, fallback: str) -> str:
    m = _HEADING.search(text)
    return m.group(1) if m else fallback


def read_notebooks(root: Path) -> list[Chapter]:
    """Every chapter (`chapters/*/index.md`) with its notebooks (`chapters/*/[0-9]*.ipynb`), in book order."""
    out = []
    for index in sorted(Path(root).glob("chapters/*/index.md")):
        folder = index.parent
        nbs = []
        for path in sorted(folder.glob("[0-9]*.ipynb")):
            data = json.loads(path.read_text(encoding="utf-8"))
            cells = data.get("cells", [])
            md = "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown")
            verified = (data.get("metadata", {}).get("pt215") or {}).get("verified") or {}
            secs = verified.get("seconds")
            nbs.append(Notebook(
                doc=str(path.relative_to(root).with_suffix("")).replace("\\", "/"),
                title=_title(md, path.stem),
                seconds=float(secs) if isinstance(secs, int | float) else None,
                prose_words=len(md.split()),
                code_cells=sum(c.get("cell_type") == "code" for c in cells),
            ))
        body = index.read_text(encoding="utf-8")
        out.append(Chapter(str(index.relative_to(root).with_suffix("")).replace("\\", "/"),
                           _title(body, folder.name), tuple(nbs)))
    return [c for c in out if c.notebooks]
