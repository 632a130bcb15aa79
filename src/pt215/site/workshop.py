"""Sphinx directives of the "Running a workshop" part: tables generated from the notebooks and measurements.

- `workshop-agenda` (options `:cut:`, one of `agenda.CUTS`, and `:chapters:`, chapter folders): the timetable
  `pt215.site.agenda.schedule` builds from the notebooks, their run times measured with N participants at once
  and the facilitator notes, so the agenda page holds no typed-in minutes;
- `workshop-hub-sizing`: processes, cores, memory (RSS and PSS) and disk per chapter, from
  `data/workshop/hub-sizing.json` (written by `scripts/measure_hub_sizing.py`);
- `workshop-concurrent-runs`: the run times with N participants at once, from
  `data/workshop/concurrent-runs.json` (`scripts/measure_hub_sizing.py --concurrent N`);
- `workshop-install-size`: what the participant install downloads and takes on disk, default and `--cpu`,
  from `data/workshop/install-size.json` (written by `scripts/measure_install_size.py`).

Registered by `pt215.site.setup`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx import addnodes

from pt215.site.agenda import (
    CONCURRENT_RUNS,
    CUTS,
    NOTES,
    Row,
    load_run_times,
    read_notebooks,
    schedule,
    select_chapters,
)

__all__ = ["register"]

HUB_SIZING = "data/workshop/hub-sizing.json"
INSTALL_SIZE = "data/workshop/install-size.json"
_KIND = {"live": "run live", "read": "walk through", "chapter": "objectives", "later": "self-study",
         "setup": "everyone", "exercise": "exercise", "wrapup": "everyone", "buffer": "slack"}


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
    if r.kind in ("break", "lunch", "buffer"):
        return [r.clock, str(r.minutes), nodes.emphasis("", r.title), _KIND.get(r.kind, ""), ""]
    run = f"{r.seconds:.0f} s" if r.seconds is not None and r.kind in ("live", "read", "later") else ""
    what: nodes.Node = _doc_link(r.doc, r.title) if r.doc else nodes.inline("", "", *_inline(r.title))
    if r.kind == "exercise":
        what = nodes.inline("", "", nodes.Text("Exercise: "), _doc_link(r.doc, r.title))
    return [r.clock if r.kind != "later" else "", str(r.minutes), what, _KIND[r.kind], run]


class AgendaDirective(Directive):
    """`workshop-agenda` with `:cut:` (one of `CUTS`) and, optionally, `:chapters:` (chapter folders, space
    separated: the programme of one part of the day or of one track)."""

    has_content = False
    option_spec = {"cut": lambda arg: directives.choice(arg, tuple(CUTS)), "chapters": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        root = Path(env.srcdir)
        chapters = read_notebooks(root)
        for ch in chapters:
            for nb in ch.notebooks:
                env.note_dependency(str(root / f"{nb.doc}.ipynb"))
        for dep in (CONCURRENT_RUNS, HUB_SIZING, NOTES):
            env.note_dependency(str(root / dep))
        missing: list[str] = []
        if self.options.get("chapters"):
            chapters, missing = select_chapters(chapters, self.options["chapters"].split())
        if not chapters:  # every chapter named is missing from this build: say so instead of a timetable
            return [nodes.paragraph("", f"Not in this build of the book: {', '.join(missing)}.")]
        s = schedule(chapters, self.options.get("cut", "day"))
        n = sum(len(ch.notebooks) for ch in chapters)
        summary = (f"{n} notebooks in {len(chapters)} chapters: {s.count('live')} run live, {s.count('read')} "
                   f"walked through from the stored outputs"
                   + (f", {s.count('later')} for self-study afterwards" if s.later else "")
                   + f"; {s.count('exercise')} exercises. "
                   + (f"The wrap-up ends at {s.end_clock}." if CUTS[s.cut].wrapup else f"It ends at {s.end_clock}."))
        if missing:
            summary += f" Not in this build of the book: {', '.join(missing)}."
        if not s.fits:
            summary += " This is later than planned: start earlier or move a chapter to a second session."
        summary += _run_time_sources(root, [nb for ch in chapters for nb in ch.notebooks])
        out: list[nodes.Node] = [nodes.paragraph("", "", *_inline(summary))]
        headers = ["start", "min", "what", "how", "run time in the room"]
        out.append(_table(headers, [_agenda_row(r) for r in s.rows], [8, 6, 60, 14, 12]))
        if s.later:
            out.append(nodes.paragraph("", "", nodes.strong("", "After the workshop (self-study)")))
            out.append(_table(headers, [_agenda_row(r) for r in s.later], [8, 6, 60, 14, 12]))
        for note in s.notes:
            out.append(nodes.paragraph("", note))
        return out


def _run_time_sources(root: Path, notebooks: Sequence[Any]) -> str:
    """Where a timetable's run times come from: how many were measured with N participants at once, how many
    are estimates (a run time measured alone, or recorded by scripts/regen.py, times the slowdown), and the
    run the slowdown was measured in, with its failed cells."""
    times = load_run_times(root)
    kinds = {"measured with": 0, "measured alone": 0, "recorded by": 0}
    for nb in notebooks:
        for k in kinds:
            if nb.how.startswith(k):
                kinds[k] += 1
    unknown = len(notebooks) - sum(kinds.values())
    n, x = times.participants, f"{times.slowdown:g}"
    parts = []
    if kinds["measured with"]:
        parts.append(f"{kinds['measured with']} measured with {n} participants at once")
    if kinds["measured alone"]:
        parts.append(f"{kinds['measured alone']} estimated as the run time measured alone (hub sizing) times {x}")
    if kinds["recorded by"]:
        parts.append(f"{kinds['recorded by']} estimated as the run time `scripts/regen.py` recorded when it "
                     f"executed the notebook, times {x}")
    if unknown:
        parts.append(f"{unknown} measured nowhere (assumed)")
    text = f" Run times in the room, of these {len(notebooks)} notebooks: " + "; ".join(parts) + "."
    conc = root / CONCURRENT_RUNS
    if times.conditions and conc.is_file():
        rows = [r for r in json.loads(conc.read_text(encoding="utf-8"))["notebooks"] if r.get("slowdown")]
        if rows:
            src = max(rows, key=lambda r: float(r["slowdown"]))
            failed = src.get("participants_with_cell_errors") or 0
            text += (f" The slowdown {x} was measured on {Path(src['notebook']).stem} alone and with {times.conditions}"
                     + (f", a run in which {failed} of {src['completed']} participants had a cell fail (hub sizing "
                        "lists the errors)" if failed else "") + ".")
    return text


def _mib(x: float) -> str:
    return f"{x / 1024:.1f} GiB" if x >= 1024 else f"{x:.0f} MiB"


def _load(directive: Directive, rel: str, command: str) -> dict:
    env = directive.state.document.settings.env
    path = Path(env.srcdir) / rel
    env.note_dependency(str(path))
    if not path.is_file():
        raise directive.error(f"{rel} not found: run {command}")
    return json.loads(path.read_text(encoding="utf-8"))


def _pss(r: dict) -> float | None:
    return r.get("peak_pss_mib")


class HubSizingDirective(Directive):
    """`workshop-hub-sizing`: the measured needs per chapter and per notebook."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        data = _load(self, HUB_SIZING, "scripts/measure_hub_sizing.py")
        prov, rows = data["provenance"], data["notebooks"]
        with_pss = [r for r in rows if _pss(r) is not None]

        def pss(rs: Sequence[dict]) -> str:
            got = [r["peak_pss_mib"] for r in rs if _pss(r) is not None]
            return _mib(max(got)) if got else "not measured"

        chapters: dict[str, list[dict]] = {}
        for r in rows:
            chapters.setdefault(r["chapter"], []).append(r)
        per_chapter = []
        for name, rs in sorted(chapters.items()):
            per_chapter.append([
                name,
                str(max(r["peak_processes"] for r in rs)),
                f"{max(r['peak_cores'] for r in rs):.1f}",
                *([pss(rs)] if with_pss else []),
                _mib(max(r["peak_rss_mib"] for r in rs)),
                _mib(max(r["peak_scratch_mib"] + r["written_to_chapter_mib"] for r in rs)),
                f"{sum(r['wall_s'] for r in rs) / 60:.1f}",
            ])
        mem = ["memory, PSS (peak)", "memory, RSS sum (peak)"] if with_pss else ["memory (peak)"]
        headers = ["chapter", "processes (peak)", "busy cores (peak)", *mem, "disk written (peak)",
                   "minutes to run all"]
        out: list[nodes.Node] = [nodes.paragraph("", "", *_inline(
            f"Measured on {prov['date']} with torch {prov['torch']}, Python {prov['python']}, on "
            f"{prov['cpu']} ({prov['cores']} cores, {prov['memory_gib']} GiB), sampling every "
            f"{prov['interval_s']} s; reproduce with `{prov['command']}`."))]
        if with_pss and len(with_pss) < len(rows):
            out.append(nodes.paragraph("", (
                f"PSS was measured for {len(with_pss)} of the {len(rows)} notebooks; the other rows come from "
                "runs that recorded the RSS sum only (re-run the script on a notebook to add its PSS).")))
        for note in prov.get("notes", []):
            out.append(nodes.paragraph("", "", nodes.strong("", "Conditions: "), *_inline(note)))
        top = max(rows, key=lambda r: r["peak_rss_mib"])
        out.append(nodes.paragraph("", (
            f"One participant, one notebook at a time: at most {max(r['peak_processes'] for r in rows)} "
            f"processes, {max(r['peak_cores'] for r in rows):.1f} busy cores, and an RSS sum of at most "
            f"{_mib(top['peak_rss_mib'])} ({Path(top['notebook']).stem})"
            + (f", whose PSS peak is {_mib(top['peak_pss_mib'])}" if _pss(top) is not None else "") + ".")))
        out.append(_table(headers, per_chapter, [22, 10, 10, *([10] * len(mem)), 10, 10]))
        if with_pss:
            out.extend(_memory_advice(with_pss))
        found = self.state.document.settings.env.found_docs
        per_nb = [[_doc_link(r["notebook"].removesuffix(".ipynb"), Path(r["notebook"]).stem)
                   if r["notebook"].removesuffix(".ipynb") in found else nodes.inline("", Path(r["notebook"]).stem),
                   str(r["peak_processes"]), f"{r['peak_cores']:.1f}",
                   *([pss([r])] if with_pss else []), _mib(r["peak_rss_mib"]),
                   f"{r['wall_s']:.0f} s"] for r in rows]
        out.append(nodes.paragraph("", "", nodes.strong("", "Per notebook")))
        nb_mem = ["memory, PSS", "memory, RSS sum"] if with_pss else ["memory"]
        out.append(_table(["notebook", "processes", "busy cores", *nb_mem, "run time"], per_nb,
                          [30, 10, 10, *([10] * len(nb_mem)), 10]))
        return out


BINDER_MAX_GIB = 2.0  # mybinder.org's user guidelines: at least 1 GB, at most 2 GB of memory per session


DOCTOR_MEM_FAIL_GIB = 4.0  # pt215.doctor.MEM_FAIL_GIB, repeated here (tests/test_workshop_pages.py keeps them equal)

TORCH_KERNEL_RSS_MIB = 300  # a kernel that imported torch holds more than this; one that never did, about 100


def per_user_memory_gib(rows: Sequence[dict]) -> tuple[float, dict, dict]:
    """(memory limit per user in GiB, the notebook with the largest PSS peak, the one with the smallest): the
    largest peak plus the smallest (one more kernel with torch imported, left open), rounded up to 0.5 GiB.
    The smallest is taken among the notebooks whose kernel imported torch (an RSS sum of at least
    `TORCH_KERNEL_RSS_MIB`), so a notebook that never imports torch does not stand for an idle torch kernel."""
    top = max(rows, key=lambda r: r["peak_pss_mib"])
    with_torch = [r for r in rows if r.get("peak_rss_mib", TORCH_KERNEL_RSS_MIB) >= TORCH_KERNEL_RSS_MIB] or rows
    low = min(with_torch, key=lambda r: r["peak_pss_mib"])
    need = (top["peak_pss_mib"] + low["peak_pss_mib"]) / 1024
    return math.ceil(need * 2) / 2, top, low


def hub_memory_limit_gib(measured_gib: float) -> float:
    """The per-user limit to configure: the measured need, but never below the doctor's failure threshold, so
    that a participant's `python -m pt215.doctor` on the hub does not fail its memory check."""
    return max(measured_gib, DOCTOR_MEM_FAIL_GIB)


def _memory_advice(rows: Sequence[dict]) -> list[nodes.Node]:
    need, top, low = per_user_memory_gib(rows)
    limit = hub_memory_limit_gib(need)
    why = (f"It is the largest PSS peak ({_mib(top['peak_pss_mib'])}, "
           f"{Path(top['notebook']).stem}) plus the smallest ({_mib(low['peak_pss_mib'])}, "
           f"{Path(low['notebook']).stem}: about one more kernel with torch imported, left open), rounded up to "
           f"half a GiB, which leaves {need * 1024 - top['peak_pss_mib'] - low['peak_pss_mib']:.0f} MiB for the "
           "user's Jupyter server (not in the measurement, which follows the kernel's processes).")
    if limit > need:
        text = (f"Per-user memory limit: {limit:g} GiB, the doctor's threshold: `python -m pt215.doctor` fails a "
                f"session with less than {DOCTOR_MEM_FAIL_GIB:g} GiB (`MEM_FAIL_GIB`, a setting). The measurements "
                f"alone ask for {need:g} GiB. " + why)
    else:
        text = f"Per-user memory limit: {limit:g} GiB. " + why
    out: list[nodes.Node] = [nodes.paragraph("", "", *_inline(
        text + f" A node for N participants needs N times {limit:g} GiB plus the hub's own processes."))]
    over = [Path(r["notebook"]).stem for r in rows if r["peak_pss_mib"] / 1024 > BINDER_MAX_GIB]
    if over:
        out.append(nodes.paragraph("", "", *_inline(
            f"mybinder.org gives a session at least 1 GB and at most {BINDER_MAX_GIB:g} GB of memory: "
            f"{len(over)} of the {len(rows)} notebooks whose PSS was measured peak above {BINDER_MAX_GIB:g} GiB "
            f"({', '.join(over)}), and "
            "a session that reaches the cap has a process killed for lack of memory (the kernel dies, or a rank "
            f"fails). The doctor also fails a machine or session with less than {DOCTOR_MEM_FAIL_GIB:g} GiB. "
            "Binder cannot carry the CPU track: a workshop needs the hub image below or the participants' own "
            "machines.")))
    else:
        out.append(nodes.paragraph("", "", (
            f"Every notebook whose PSS was measured peaks below mybinder.org's {BINDER_MAX_GIB:g} GB cap per "
            "session.")))
    return out


class ConcurrentRunsDirective(Directive):
    """`workshop-concurrent-runs`: each measured notebook alone and with N participants at once."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        data = _load(self, CONCURRENT_RUNS, "scripts/measure_hub_sizing.py --concurrent 6 --out " + CONCURRENT_RUNS)
        prov, rows = data["provenance"], data["notebooks"]
        n = prov["participants"]
        out: list[nodes.Node] = [nodes.paragraph("", "", *_inline(
            f"Measured on {prov['date']} with torch {prov['torch']} on {prov['cpu']} ({prov['cores']} cores, "
            f"{prov['memory_gib']} GiB): each notebook alone, then {n} copies started together, each with its "
            f"own kernel; reproduce with `{prov['command']}`."))]
        table = []
        for r in rows:
            walls = r["concurrent_wall_s"]
            pss = r["peak_pss_mib_per_participant"]
            before = r["conditions_before"]
            table.append([
                _doc_link(r["notebook"].removesuffix(".ipynb"), Path(r["notebook"]).stem),
                f"{r['solo_wall_s']:.0f} s",
                f"{r['median_wall_s']:.0f} s ({walls[0]:.0f}-{walls[-1]:.0f})" if walls else "none finished",
                f"{r['slowdown']:.1f}x" if r.get("slowdown") else "",
                f"{_mib(r['solo_peak_pss_mib'])} / {_mib(max(pss))}" if pss else "",
                _mib(sum(pss)) if pss else "",
                f"{r['participants_with_cell_errors']} of {r['completed']}",
                f"{before['load_average_1_5_15'][0]:g}; {before['memory_available_gib']:g} GiB",
            ])
        headers = ["notebook", "alone", f"{n} at once: median (range)", "slowdown",
                   f"PSS peak: alone / largest of {n}", f"PSS peaks, sum of {n}", "participants with a failed cell",
                   "load average; memory available before"]
        out.append(_table(headers, table, [24, 8, 14, 8, 14, 10, 10, 14]))
        for r in rows:
            if r.get("errors"):
                out.append(nodes.paragraph("", "", *_inline(
                    f"Cells that failed in {Path(r['notebook']).stem} with {n} at once (none alone)"
                    if not r.get("solo_errors") else f"Cells that failed in {Path(r['notebook']).stem}"),
                    nodes.Text(": " + "; ".join(e.rstrip(" :.") for e in r["errors"]) + ".")))
        return out


class InstallSizeDirective(Directive):
    """`workshop-install-size`: download and disk of the participant install, default and `--cpu`."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        data = _load(self, INSTALL_SIZE, "scripts/measure_install_size.py")
        prov, d = data["provenance"], data
        gb = 1e9

        def size(x: float | None) -> str:
            return "not measured" if x is None else f"{x / gb:.2f} GB"

        def cpu(part: dict) -> str:
            if part["cpu_choice_bytes"] is not None:
                return size(part["cpu_choice_bytes"])
            if part["rest_bytes"] is not None:
                return f"{size(part['rest_bytes'])} + torch's CPU wheel"
            return "not measured"

        rows = [["download (wheels)", size(d["download"]["total_bytes"]), cpu(d["download"])],
                ["on disk (the virtual environment)", size(d["disk"]["total_bytes"]), cpu(d["disk"])]]
        out: list[nodes.Node] = [_table(["", "default (PyPI torch, CUDA build on Linux)", "--cpu"],
                                        rows, [30, 20, 20])]
        out.append(nodes.paragraph("", "", *_inline(
            f"Measured on {prov['date']} for Python {prov['python']} on {prov['machine']} with "
            f"`{prov['command']}`. {d['cpu_choice_how']}")))
        return out


def register(app) -> None:
    """Add the workshop directives to a Sphinx app (called from `pt215.site.setup`)."""
    app.add_directive("workshop-agenda", AgendaDirective)
    app.add_directive("workshop-hub-sizing", HubSizingDirective)
    app.add_directive("workshop-concurrent-runs", ConcurrentRunsDirective)
    app.add_directive("workshop-install-size", InstallSizeDirective)
