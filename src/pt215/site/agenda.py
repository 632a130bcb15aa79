"""The workshop agenda, generated from the notebooks, the measurements and the facilitator notes ("Running a
workshop", agenda page).

`read_notebooks(root)` reads each chapter notebook's title and how much there is to read, its run time in the
room (`load_run_times`: measured with N participants running it at once, `data/workshop/concurrent-runs.json`,
or measured alone, `data/workshop/hub-sizing.json`, times the slowdown measured with N participants) and, from
the facilitator notes (`chapters/workshop/notes.md`), each chapter's exercise slot and the notebooks that stay
live. `schedule(chapters, cut)` is a pure function that turns them into a one-day or half-day timetable:
setup with the doctor, each chapter's opener next to its first notebook, the notebooks (run live or walked
through), the exercise, breaks with a buffer before each, and a wrap-up with feedback. The
`workshop-agenda` directive (registered by `pt215.site`) renders it, so the agenda changes when a notebook, a
measurement or the notes do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = ["CUTS", "Chapter", "Exercise", "Notebook", "Row", "RunTimes", "Schedule", "load_run_times", "minutes",
           "read_notes", "read_notebooks", "schedule", "select_chapters"]

PROSE_WPM = 150          # reading speed for technical prose
CODE_CELL_MIN = 0.5      # reading one code cell and its output
LIVE_EXTRA_MIN = 5       # a live notebook: questions while it runs, trying a change
READ_FACTOR = 0.5        # a walk-through from the stored outputs covers the text in half the time
READ_EXTRA_MIN = 3       # a walk-through: one discussion question
CHAPTER_MIN = 5          # a chapter's objectives and its hardware line, from its index page
SETUP_MIN = 10           # everyone runs `python -m pt215.doctor` and fixes what it says (the guide's first ten minutes)
WRAPUP_MIN = 15          # what to take home, the feedback form
BUFFER_MIN = 10          # kept free at the end of every block, before a break and before the end of the day
DEFAULT_SECONDS = 120.0  # run time assumed for a notebook measured nowhere
ROUND_MIN = 5
CONCURRENT_RUNS = "data/workshop/concurrent-runs.json"
HUB_SIZING = "data/workshop/hub-sizing.json"
NOTES = "chapters/workshop/notes.md"


@dataclass(frozen=True)
class Notebook:
    """One chapter notebook: page name (`chapters/02-flight-recorder/02-2-hang-lab`), title, size, run time in
    the room (seconds), and `how` that run time was obtained; `live_always` when the notes keep it live."""

    doc: str
    title: str
    seconds: float | None
    prose_words: int
    code_cells: int
    how: str = ""
    live_always: bool = False


@dataclass(frozen=True)
class Exercise:
    """The exercise a chapter does in the room (from the facilitator notes): its title and minutes."""

    title: str
    minutes: int


@dataclass(frozen=True)
class Chapter:
    doc: str
    title: str
    notebooks: tuple[Notebook, ...]
    exercise: Exercise | None = None


@dataclass(frozen=True)
class Cut:
    """A workshop length: blocks of teaching time (start, end in minutes after midnight) and the breaks between."""

    name: str
    blocks: tuple[tuple[int, int], ...]
    breaks: tuple[str, ...]  # the name of the break after each block but the last
    setup: bool = True   # opens with the doctor (the first part of a day)
    wrapup: bool = True  # ends with the wrap-up (the last part of a day)


#: "day" and "half" place the chapters given in book order; "morning" and "afternoon" are the two halves of a
#: day whose morning is one programme for the room and whose afternoon is parallel tracks (the agenda page).
CUTS = {
    "day": Cut("day", ((540, 630), (645, 750), (810, 900), (915, 1020)), ("Break", "Lunch", "Break")),
    # the half day is the morning's programme plus its wrap-up, so it runs 15 minutes past the morning's 12:30
    "half": Cut("half", ((540, 630), (645, 765)), ("Break",)),
    "morning": Cut("morning", ((540, 630), (645, 750)), ("Break",), wrapup=False),
    "afternoon": Cut("afternoon", ((810, 900), (915, 1020)), ("Break",), setup=False),
}
KINDS = ("setup", "chapter", "live", "read", "exercise", "buffer", "break", "lunch", "wrapup", "later")


@dataclass(frozen=True)
class Row:
    start: int
    minutes: int
    kind: str      # one of KINDS; "later" for self-study after the workshop
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
    end: int                 # when the wrap-up ends (the buffer after it is in `rows`)
    fits: bool               # the wrap-up ends at least BUFFER_MIN before the planned end
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
    """Minutes a notebook takes in the room: run live (reading + run time in the room + questions) or walked
    through from the stored outputs."""
    reading = nb.prose_words / PROSE_WPM + nb.code_cells * CODE_CELL_MIN
    if live:
        run = (nb.seconds if nb.seconds is not None else DEFAULT_SECONDS) / 60
        return _round(reading + run + LIVE_EXTRA_MIN)
    return _round(reading * READ_FACTOR + READ_EXTRA_MIN)


# ---------------------------------------------------------------- the timetable

_Item = tuple[str, int, str, str, float | None]  # kind, minutes, title, doc, seconds


def _units(chapters: tuple[Chapter, ...], mode: dict[str, str], cut: Cut) -> tuple[list[list[_Item]], list[Row]]:
    """What is placed, in order, as units that a break never splits (a chapter's opener with its first
    notebook in the room; the exercise with the chapter's last notebook), and the notebooks left for
    self-study."""
    units: list[list[_Item]] = ([[("setup", SETUP_MIN, "Setup: everyone runs `python -m pt215.doctor`", "", None)]]
                                if cut.setup else [])
    later: list[Row] = []
    for ch in chapters:
        in_room = [nb for nb in ch.notebooks if mode[nb.doc] != "later"]
        later.extend(Row(0, minutes(nb, True), "later", nb.title, nb.doc, nb.seconds)
                     for nb in ch.notebooks if mode[nb.doc] == "later")
        if not in_room:
            continue
        items = [(mode[nb.doc], minutes(nb, mode[nb.doc] == "live"), nb.title, nb.doc, nb.seconds) for nb in in_room]
        chapter_units = [[("chapter", CHAPTER_MIN, ch.title, ch.doc, None), items[0]], *([it] for it in items[1:])]
        if ch.exercise is not None:  # the exercise stays with the chapter's last notebook
            chapter_units[-1].append(("exercise", ch.exercise.minutes, ch.exercise.title, ch.doc, None))
        units.extend(chapter_units)
    if cut.wrapup:
        units.append([("wrapup", WRAPUP_MIN, "Wrap-up: questions, what to try at work, the feedback form", "", None)])
    return units, later


def _lay_out(chapters: tuple[Chapter, ...], mode: dict[str, str], cut: Cut) -> tuple[list[Row], list[Row], int]:
    units, later = _units(chapters, mode, cut)
    rows: list[Row] = []
    block = 0
    t = cut.blocks[0][0]
    for unit in units:
        need = sum(it[1] for it in unit)
        while (block < len(cut.blocks) - 1 and t + need > cut.blocks[block][1] - BUFFER_MIN
               and t > cut.blocks[block][0]):
            end = cut.blocks[block][1]
            if end > t:
                rows.append(Row(t, end - t, "buffer", "Buffer"))
            t = max(t, end)
            name = cut.breaks[block]
            pause = cut.blocks[block + 1][0] - cut.blocks[block][1]
            rows.append(Row(t, pause, "lunch" if name == "Lunch" else "break", name))
            t += pause
            block += 1
        for kind, mins, title, doc, secs in unit:
            rows.append(Row(t, mins, kind, title, doc, secs))
            t += mins
    end = t
    if cut.blocks[-1][1] > t:
        rows.append(Row(t, cut.blocks[-1][1] - t, "buffer", "Buffer"))
    return rows, later, end


def schedule(chapters: list[Chapter] | tuple[Chapter, ...], cut: str = "day") -> Schedule:
    """Timetable for `cut` (one of `CUTS`) that places every notebook of `chapters`, in book order.

    Every notebook starts live (participants run it). While the wrap-up would end later than `BUFFER_MIN`
    before the planned end, notebooks are downgraded one at a time, in this order: a chapter's later notebooks
    become walk-throughs (the one saving the most time first), then they move to self-study after the
    workshop (`Schedule.later`, longest first), then each chapter's first notebook does the same. Notebooks
    the notes keep live (`Notebook.live_always`) are never downgraded. A notebook is never dropped: it is in
    the room or in `later`. Then the time the downgrades freed is filled again: notebooks are promoted back
    one step (self-study to walk-through, walk-through to live), in book order, while the day still fits.
    """
    if cut not in CUTS:
        raise ValueError(f"schedule(): cut must be one of {', '.join(CUTS)}; got {cut!r}")
    chapters = tuple(chapters)
    if not chapters or not all(isinstance(c, Chapter) and c.notebooks for c in chapters):
        raise ValueError("schedule(): chapters must be a non-empty list of Chapter with notebooks "
                         "(see read_notebooks)")
    spec = CUTS[cut]
    planned_end = spec.blocks[-1][1]
    target = planned_end - BUFFER_MIN
    firsts = {ch.notebooks[0].doc for ch in chapters}
    every = [nb for ch in chapters for nb in ch.notebooks]
    mode = {nb.doc: "live" for nb in every}
    stages = [(False, "live", "read", lambda nb: minutes(nb, True) - minutes(nb, False)),
              (False, "read", "later", lambda nb: minutes(nb, False)),
              (True, "live", "read", lambda nb: minutes(nb, True) - minutes(nb, False)),
              (True, "read", "later", lambda nb: minutes(nb, False))]
    rows, later, end = _lay_out(chapters, mode, spec)
    for first, old, new, gain in stages:
        while end > target:
            pool = [nb for nb in every
                    if (nb.doc in firsts) == first and mode[nb.doc] == old and not nb.live_always]
            if not pool:
                break
            # the biggest gain first; among equals, the later notebook in the book
            best = max(pool, key=lambda nb: (gain(nb), every.index(nb)))
            mode[best.doc] = new
            rows, later, end = _lay_out(chapters, mode, spec)
    # Fill what the downgrades freed: promote notebooks back one step at a time (self-study to walk-through,
    # walk-through to live), in book order, while the day still fits.
    changed = end <= target
    while changed:
        changed = False
        for nb in every:
            up = {"later": "read", "read": "live"}.get(mode[nb.doc])
            if up is None:
                continue
            mode[nb.doc] = up
            trial = _lay_out(chapters, mode, spec)
            if trial[2] <= target:
                rows, later, end = trial
                changed = True
            else:
                mode[nb.doc] = {"read": "later", "live": "read"}[up]
    notes = tuple(f"{nb.doc}: measured nowhere, run time assumed {DEFAULT_SECONDS:g} s"
                  for nb in every if nb.seconds is None)
    return Schedule(cut, tuple(rows), end, end <= target, planned_end, tuple(later), notes)


# ---------------------------------------------------------------- inputs: notebooks, measurements, notes


@dataclass(frozen=True)
class RunTimes:
    """Run times in the room: `measured` {notebook doc: seconds with `participants` at once}, `alone`
    {doc: seconds measured alone}, and `slowdown`, the largest measured ratio of the two."""

    participants: int = 1
    measured: dict[str, float] = field(default_factory=dict)
    alone: dict[str, float] = field(default_factory=dict)
    slowdown: float = 1.0
    conditions: str = ""

    def seconds(self, doc: str, recorded: float | None) -> tuple[float | None, str]:
        """(seconds in the room, how they were obtained) for a notebook; `recorded` is its regen run time."""
        n = self.participants
        if doc in self.measured:
            return self.measured[doc], f"measured with {n} participants at once"
        if doc in self.alone:
            return self.alone[doc] * self.slowdown, f"measured alone x {self.slowdown:g} (the slowdown with {n})"
        if recorded is not None:
            return recorded * self.slowdown, f"recorded by scripts/regen.py x {self.slowdown:g}"
        return None, ""


def _doc(notebook: str) -> str:
    return notebook.removesuffix(".ipynb").replace("\\", "/")


def load_run_times(root: Path) -> RunTimes:
    """Run times from `data/workshop/concurrent-runs.json` and `data/workshop/hub-sizing.json` (either may be
    missing: then the slowdown is 1 and the recorded run times are used as they are)."""
    root = Path(root)
    alone: dict[str, float] = {}
    hub = root / HUB_SIZING
    if hub.is_file():
        alone = {_doc(r["notebook"]): float(r["wall_s"]) for r in json.loads(hub.read_text())["notebooks"]}
    conc = root / CONCURRENT_RUNS
    if not conc.is_file():
        return RunTimes(1, {}, alone, 1.0, "")
    data = json.loads(conc.read_text())
    prov = data["provenance"]
    rows = [r for r in data["notebooks"] if r.get("median_wall_s")]
    measured = {_doc(r["notebook"]): float(r["median_wall_s"]) for r in rows}
    slowdown = max((float(r["slowdown"]) for r in rows), default=1.0)
    loads = [r["conditions_before"]["load_average_1_5_15"][0] for r in rows]
    low, high = min(loads, default=0.0), max(loads, default=0.0)
    span = f"{low:g}" if low == high else f"{low:g} to {high:g}"
    conditions = (f"{prov['participants']} participants at once on {prov['cores']} cores "
                  f"({prov['date']}, load average {span} before the run)" if loads else "")
    return RunTimes(int(prov["participants"]), measured, alone, slowdown, conditions)


_SECTION = re.compile(r"^##\s+(\d+)\s", re.M)
_EXERCISE = re.compile(r"\*\*In the room, (\d+) min: (.+?)\.\*\*")
_LIVE = re.compile(r"\*\*Run live, always\.\*\*([^:\n]*)")


def read_notes(text: str) -> dict[int, tuple[Exercise | None, tuple[str, ...]]]:
    """Per chapter number in the facilitator notes: its exercise slot (`**In the room, N min: TITLE.**`) and
    the notebook numbers it keeps live (`**Run live, always.** 2.2`)."""
    out: dict[int, tuple[Exercise | None, tuple[str, ...]]] = {}
    marks = list(_SECTION.finditer(text))
    for i, m in enumerate(marks):
        body = text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        ex = _EXERCISE.search(body)
        live = _LIVE.search(body)
        out[int(m.group(1))] = (Exercise(ex.group(2), int(ex.group(1))) if ex else None,
                                tuple(re.findall(r"\d+\.\d+", live.group(1))) if live else ())
    return out


_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.M)


def _title(text: str, fallback: str) -> str:
    m = _HEADING.search(text)
    return m.group(1) if m else fallback


def read_notebooks(root: Path) -> list[Chapter]:
    """Every chapter (`chapters/*/index.md`) with its notebooks (`chapters/*/[0-9]*.ipynb`), in book order, with
    run times from `load_run_times` and exercise slots from the facilitator notes."""
    root = Path(root)
    times = load_run_times(root)
    notes_file = root / NOTES
    notes = read_notes(notes_file.read_text(encoding="utf-8")) if notes_file.is_file() else {}
    out = []
    for index in sorted(root.glob("chapters/*/index.md")):
        folder = index.parent
        number = int(folder.name.split("-", 1)[0]) if folder.name[:2].isdigit() else None
        exercise, live = notes.get(number, (None, ())) if number is not None else (None, ())
        nbs = []
        for path in sorted(folder.glob("[0-9]*.ipynb")):
            data = json.loads(path.read_text(encoding="utf-8"))
            cells = data.get("cells", [])
            md = "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown")
            verified = (data.get("metadata", {}).get("pt215") or {}).get("verified") or {}
            secs = verified.get("seconds")
            doc = str(path.relative_to(root).with_suffix("")).replace("\\", "/")
            seconds, how = times.seconds(doc, float(secs) if isinstance(secs, int | float) else None)
            parts = path.stem.split("-")
            dotted = f"{int(parts[0])}.{parts[1]}" if len(parts) > 1 and parts[1].isdigit() else ""
            nbs.append(Notebook(
                doc=doc,
                title=_title(md, path.stem),
                seconds=round(seconds, 1) if seconds is not None else None,
                prose_words=len(md.split()),
                code_cells=sum(c.get("cell_type") == "code" for c in cells),
                how=how,
                live_always=dotted in live,
            ))
        body = index.read_text(encoding="utf-8")
        out.append(Chapter(str(index.relative_to(root).with_suffix("")).replace("\\", "/"),
                           _title(body, folder.name), tuple(nbs), exercise))
    return [c for c in out if c.notebooks]


def select_chapters(chapters: list[Chapter], folders: list[str] | tuple[str, ...]) -> tuple[list[Chapter], list[str]]:
    """The chapters whose folder (`chapters/<folder>/index`) is in `folders`, in book order, and the folders
    named that no chapter has (a track's programme on the agenda page)."""
    if isinstance(folders, str) or not all(isinstance(f, str) and f for f in folders):
        raise ValueError(f"select_chapters(): folders must be a list of chapter folder names; got {folders!r}")
    by_folder = {c.doc.split("/")[-2]: c for c in chapters if c.doc.count("/") >= 2}
    return [c for f, c in by_folder.items() if f in folders], [f for f in folders if f not in by_folder]


def with_notebook(chapter: Chapter, doc: str, **changes) -> Chapter:
    """A copy of `chapter` with one notebook changed (tests, what-if plans)."""
    return replace(chapter, notebooks=tuple(replace(nb, **changes) if nb.doc == doc else nb
                                            for nb in chapter.notebooks))

