"""Recorded hardware runs on the book's pages: the `{hardware-runs}` directive (intro and chapters 1-6).

Records are the JSON files `python -m pt215.verify --out ...` writes, kept in `data/hardware-runs/` (schema
and provenance rules in its README). For each gated path of `pt215.verify.PATHS`, a page lists the runs that
verified it ("passed on NVIDIA H200 sm_90, torch 2.15.0, driver 570.86, 2026-12-01") and says plainly when
nothing has. Fake-CUDA passes are named as such: they checked shapes and dtypes, no kernel ran.

    ```{hardware-runs}
    :chapter: 5
    ```

Without `:chapter:` the directive renders the matrix of every chapter (the landing page).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RECORD_KEYS", "CHECK_KEYS", "load_records", "path_rows", "run_label", "setup", "validate_record"]

RECORD_KEYS = ("schema", "date", "command", "seconds", "machine", "checks")
MACHINE_KEYS = ("torch", "cuda", "driver", "nccl", "cudnn", "python", "platform", "macos", "mps", "gpus", "summary")
CHECK_KEYS = ("id", "chapter", "title", "needs", "status", "mode")
STATUSES = ("passed", "failed", "skipped")
NOTHING = "nothing has verified this path on hardware yet"


def validate_record(rec: Any, name: str = "record") -> None:
    """Raise ValueError naming the first problem if `rec` is not a pt215.verify record (schema 1)."""
    if not isinstance(rec, dict):
        raise ValueError(f"{name}: a record must be a JSON object, got {type(rec).__name__}")
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{name}: missing keys {missing}")
    if rec["schema"] != 1:
        raise ValueError(f"{name}: schema must be 1, got {rec['schema']!r}")
    if not str(rec["command"]).startswith("python -m pt215.verify"):
        raise ValueError(f"{name}: command must be the pt215.verify command that produced it, got {rec['command']!r}")
    m = rec["machine"]
    missing = [k for k in MACHINE_KEYS if not isinstance(m, dict) or k not in m]
    if missing:
        raise ValueError(f"{name}: machine is missing {missing}")
    for g in m["gpus"]:
        if not (isinstance(g, dict) and str(g.get("capability", "")).startswith("sm_") and g.get("name")):
            raise ValueError(f"{name}: each GPU needs a name and an sm_NN capability, got {g!r}")
    if not isinstance(rec["checks"], list) or not rec["checks"]:
        raise ValueError(f"{name}: checks must be a non-empty list")
    for c in rec["checks"]:
        missing = [k for k in CHECK_KEYS if k not in c]
        if missing:
            raise ValueError(f"{name}: check {c.get('id', '?')!r} is missing {missing}")
        if c["status"] not in STATUSES:
            raise ValueError(f"{name}: check {c['id']!r} has status {c['status']!r}; expected one of {STATUSES}")
        if c["status"] != "passed" and not c.get("reason"):
            raise ValueError(f"{name}: check {c['id']!r} is {c['status']} without a reason")
        if c["status"] == "passed" and c["mode"] == "real" and c["needs"] and not _could_run(c["needs"], m):
            raise ValueError(f"{name}: check {c['id']!r} passed for real but the machine lacks {c['needs']}")


def _could_run(needs: Sequence[str], machine: dict[str, Any]) -> bool:
    """Whether a machine as recorded could meet `needs` (a GPU result needs GPUs in the record)."""
    for need in needs:
        if need.startswith(("cuda", "sm_", "nccl")) and not machine["gpus"]:
            return False
        if need.startswith(("mps", "macos")) and not machine.get("mps"):
            return False
    return True


def load_records(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every `*.json` record in `folder`, validated, sorted by date (newest first)."""
    out = []
    for f in sorted(folder.glob("*.json")):
        rec = json.loads(f.read_text(encoding="utf-8"))
        validate_record(rec, f.name)
        out.append((f.name, rec))
    return sorted(out, key=lambda r: r[1]["date"], reverse=True)


def run_label(rec: dict[str, Any]) -> str:
    """`NVIDIA H200 sm_90, torch 2.15.0, driver 570.86, 2026-12-01` (or the CPU/Mac description)."""
    m = rec["machine"]
    if m["gpus"]:
        names = sorted({f"{g['name']} {g['capability']}" for g in m["gpus"]})
        where = f"{len(m['gpus'])}x " + ", ".join(names)
    elif m.get("mps"):
        where = f"Apple MPS, macOS {m.get('macos')}"
    else:
        where = f"{m['summary']}"
    parts = [where, f"torch {m['torch']}"]
    if m.get("driver"):
        parts.append(f"driver {m['driver']}")
    if m["gpus"] and m.get("cudnn"):
        parts.append(f"cuDNN {m['cudnn']}")
    parts.append(str(rec["date"])[:10])
    return ", ".join(parts)


def path_rows(paths: Sequence[Any], records: Sequence[tuple[str, dict[str, Any]]], chapter: int | None = None
              ) -> list[tuple[str, str, str, list[str]]]:
    """(id, title, needs, verdict lines) per gated path of `chapter` (all when None), from the records."""
    rows = []
    for p in paths:
        if chapter is not None and p.chapter != chapter:
            continue
        lines = []
        for _name, rec in records:
            for c in rec["checks"]:
                if c["id"] != p.id or c["status"] == "skipped":
                    continue
                if c["status"] == "failed":
                    lines.append(f"FAILED on {run_label(rec)}: {c.get('reason', '')}")
                elif c["mode"] != "real":
                    lines.append(f"passed on {run_label(rec)} ({c['mode']})")
                else:
                    lines.append(f"passed on {run_label(rec)}")
        if not any(ln.startswith("passed") and "fake CUDA" not in ln for ln in lines) and p.needs:
            lines.append(NOTHING)
        if not lines:
            lines.append("no run recorded yet")
        needs = ", ".join(p.needs) or "nothing (fake CUDA)"
        rows.append((p.id, p.title, needs, lines))
    return rows


# ------------------------------------------------------------------------------------------ the directive


def _table(rows: list[tuple[str, str, str, list[str]]], with_chapter: bool):
    from docutils import nodes

    heads = ["gated path", "needs", "recorded runs"]
    table = nodes.table(classes=["pt215-hardware-runs"])
    group = nodes.tgroup(cols=len(heads))
    table += group
    for width in (30, 15, 55):
        group += nodes.colspec(colwidth=width)
    thead = nodes.thead()
    group += thead
    row = nodes.row()
    for h in heads:
        row += nodes.entry("", nodes.paragraph(text=h))
    thead += row
    body = nodes.tbody()
    group += body
    for pid, title, needs, lines in rows:
        row = nodes.row()
        first = nodes.entry()
        first += nodes.paragraph("", "", nodes.literal(text=pid))
        first += nodes.paragraph(text=title)
        row += first
        row += nodes.entry("", nodes.paragraph(text=needs))
        cell = nodes.entry()
        for line in lines:
            cell += nodes.paragraph(text=line)
        row += cell
        body += row
    return table


def setup(app) -> dict[str, Any]:
    """Register `{hardware-runs}` (called from `pt215.book.setup`)."""
    from docutils.parsers.rst import Directive, directives

    class HardwareRuns(Directive):
        """`{hardware-runs}` with an optional `:chapter: N`: the recorded runs of each gated path."""

        option_spec = {"chapter": directives.nonnegative_int}

        def run(self):
            from pt215.verify import PATHS

            env = self.state.document.settings.env
            folder = Path(env.srcdir) / "data" / "hardware-runs"
            for f in sorted(folder.glob("*.json")):
                env.note_dependency(str(f))
            records = load_records(folder)
            chapter = self.options.get("chapter")
            return [_table(path_rows(PATHS, records, chapter), chapter is None)]

    app.add_directive("hardware-runs", HardwareRuns)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
