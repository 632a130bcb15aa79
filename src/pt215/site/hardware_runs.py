"""Recorded hardware runs on the book's pages: the `{hardware-runs}` directive (intro and chapters 1-6).

Records are the JSON files `python -m pt215.verify --out ...` writes, kept in `data/hardware-runs/` (schema
and provenance rules in its README), read as `pt215.verify.record.RunRecord`s. For each gated path of
`pt215.verify.paths.PATHS`, a page lists the runs that verified it ("passed on NVIDIA H200 sm_90, torch
2.15.0, driver 570.86, 2026-12-01") and says plainly when nothing has. Fake-CUDA passes are named as such:
they checked shapes and dtypes, no kernel ran.

    ```{hardware-runs}
    :chapter: 5
    ```

Without `:chapter:` the directive covers every chapter (the landing page). Either way it starts with one
summary line ("0 of 31 hardware paths have run on hardware; 7 checked on fake CUDA; 3 on CPU"); only paths
that passed on the hardware they need (a recorded GPU or Apple GPU) are listed under "Run on hardware"; the
rest, with what did run for them (fake CUDA, CPU, nothing), sit in a collapsed list, one line per path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pt215.needs import describe_need
from pt215.verify.paths import PATHS, GatedPath
from pt215.verify.record import RunRecord

__all__ = ["classify", "load_records", "need_words", "render", "setup", "summary_line"]

Records = Sequence[tuple[str, RunRecord]]


def load_records(folder: Path) -> list[tuple[str, RunRecord]]:
    """Every `*.json` record in `folder` as (file name, record), checked, newest first."""
    out = [(f.name, RunRecord.from_dict(json.loads(f.read_text(encoding="utf-8")), f.name))
           for f in sorted(folder.glob("*.json"))]
    return sorted(out, key=lambda r: r[1].date, reverse=True)


def need_words(needs: Sequence[str]) -> str:
    """`("cuda>=2", "nccl")` -> "≥ 2 CUDA GPUs and NCCL with a CUDA GPU"; no needs -> "nothing (fake CUDA)"."""
    if not needs:
        return "nothing (fake CUDA)"
    return " and ".join(describe_need(n).replace(">= ", "≥ ") for n in needs)


def classify(p: GatedPath, records: Records) -> tuple[str, list[str]]:
    """Where a gated path stands: "hardware" (passed on a recorded GPU or Apple GPU), "fake" (passed on fake
    CUDA), "cpu" (passed on a machine without either), "failed", or "none"; and one line per recorded run."""
    lines, kinds = [], set()
    for _name, rec in records:
        for c in rec.checks:
            if c.id != p.id or c.status == "skipped":
                continue
            if c.status == "failed":
                kinds.add("failed")
                lines.append(f"FAILED on {rec.label()}: {c.reason}")
            elif not c.real:
                kinds.add("fake")
                lines.append(f"checked on fake CUDA ({rec.label()}): shapes and dtypes, no kernel ran")
            elif rec.machine.accelerated:
                kinds.add("hardware")
                lines.append(f"passed on {rec.label()}")
            else:
                kinds.add("cpu")
                lines.append(f"passed on CPU ({rec.label()})")
    kind = next((k for k in ("hardware", "failed", "cpu", "fake") if k in kinds), "none")
    return kind, lines or ["nothing has run it yet"]


def summary_line(paths: Sequence[GatedPath], records: Records) -> str:
    """"0 of 31 hardware paths have run on hardware; 7 checked on fake CUDA; 3 on CPU"."""
    kinds = [(bool(p.needs), classify(p, records)[0]) for p in paths]
    hw = [k for needs, k in kinds if needs]
    n_fake = sum(k == "fake" for _n, k in kinds)
    failed = sum(k == "failed" for _n, k in kinds)
    line = (f"{sum(k == 'hardware' for k in hw)} of {len(hw)} hardware paths have run on hardware; "
            f"{n_fake} checked on fake CUDA; {sum(k == 'cpu' for k in hw)} on CPU")
    return line + (f"; {failed} failed" if failed else "")


# ------------------------------------------------------------------------------------------ the directive


def _entries(paths: Sequence[GatedPath], records: Records):
    """A bullet list, one item per path: its id, what it needs in words, and what ran (one line each)."""
    from docutils import nodes

    items = nodes.bullet_list(classes=["pt215-hardware-runs"])
    for p in paths:
        _kind, lines = classify(p, records)
        para = nodes.paragraph()
        para += nodes.literal(text=p.id)
        para += nodes.Text(f" ({need_words(p.needs)}): {'; '.join(lines)}. ")
        para += nodes.emphasis(text=p.title)
        items += nodes.list_item("", para)
    return items


def render(paths: Sequence[GatedPath], records: Records) -> list:
    """The directive's nodes: the summary line, the paths run on hardware, the rest collapsed (a `<details>`
    element, one line per path, so the list stays short on a phone)."""
    from docutils import nodes

    done = [p for p in paths if classify(p, records)[0] == "hardware"]
    rest = [p for p in paths if p not in done]
    out: list = [nodes.paragraph("", "", nodes.strong(text=summary_line(paths, records) + "."))]
    head = nodes.paragraph()
    head += nodes.strong(text=f"Run on hardware ({len(done)})")
    head += nodes.Text(": none yet." if not done else "")
    out.append(head)
    if done:
        out.append(_entries(done, records))
    if rest:
        waiting = sum(bool(p.needs) for p in rest)
        out.append(nodes.raw("", f"<details class=\"pt215-hardware-runs\"><summary>The other {len(rest)} paths: "
                                 f"{waiting} hardware paths not yet run on their hardware, and {len(rest) - waiting} "
                                 "fake-CUDA checks that need none</summary>", format="html"))
        out.append(_entries(rest, records))
        out.append(nodes.raw("", "</details>", format="html"))
    return out


def setup(app) -> dict[str, Any]:
    """Register `{hardware-runs}` (called from `pt215.site.setup`)."""
    from docutils.parsers.rst import Directive, directives

    class HardwareRuns(Directive):
        """`{hardware-runs}` with an optional `:chapter: N`: the recorded runs of each gated path."""

        option_spec = {"chapter": directives.nonnegative_int}

        def run(self):
            env = self.state.document.settings.env
            folder = Path(env.srcdir) / "data" / "hardware-runs"
            for f in sorted(folder.glob("*.json")):
                env.note_dependency(str(f))
            records = load_records(folder)
            chapter = self.options.get("chapter")
            return render([p for p in PATHS if chapter is None or p.chapter == chapter], records)

    app.add_directive("hardware-runs", HardwareRuns)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
