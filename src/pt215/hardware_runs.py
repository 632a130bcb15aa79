"""Recorded hardware runs on the book's pages: the `{hardware-runs}` directive (intro and chapters 1-6).

Records are the JSON files `python -m pt215.verify --out ...` writes, kept in `data/hardware-runs/` (schema
and provenance rules in its README). For each gated path of `pt215.verify.PATHS`, a page lists the runs that
verified it ("passed on NVIDIA H200 sm_90, torch 2.15.0, driver 570.86, 2026-12-01") and says plainly when
nothing has. Fake-CUDA passes are named as such: they checked shapes and dtypes, no kernel ran.

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

__all__ = ["RECORD_KEYS", "CHECK_KEYS", "classify", "load_records", "need_words", "run_label", "setup",
           "summary_line", "validate_record"]

RECORD_KEYS = ("schema", "date", "command", "seconds", "machine", "checks")
MACHINE_KEYS = ("torch", "cuda", "driver", "nccl", "cudnn", "python", "platform", "macos", "mps", "gpus", "summary")
CHECK_KEYS = ("id", "chapter", "title", "needs", "status", "mode")
STATUSES = ("passed", "failed", "skipped")


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
    if not isinstance(rec["checks"], list) or not (rec["checks"] or isinstance(rec.get("boundary"), dict)):
        raise ValueError(f"{name}: checks must be a non-empty list (or the record holds a boundary run)")
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


def need_words(needs: Sequence[str]) -> str:
    """`("cuda>=2", "nccl")` -> "≥ 2 CUDA GPUs and NCCL with a CUDA GPU"; no needs -> "nothing (fake CUDA)"."""
    from pt215.hardware import _describe

    if not needs:
        return "nothing (fake CUDA)"
    return " and ".join(_describe(n).replace(">= ", "≥ ") for n in needs)


def _accelerated(rec: dict[str, Any]) -> bool:
    return bool(rec["machine"]["gpus"] or rec["machine"].get("mps"))


def classify(p: Any, records: Sequence[tuple[str, dict[str, Any]]]) -> tuple[str, list[str]]:
    """Where a gated path stands: "hardware" (passed on a recorded GPU or Apple GPU), "fake" (passed on fake
    CUDA), "cpu" (passed on a machine without either), "failed", or "none"; and one line per recorded run."""
    lines, kinds = [], set()
    for _name, rec in records:
        for c in rec["checks"]:
            if c["id"] != p.id or c["status"] == "skipped":
                continue
            if c["status"] == "failed":
                kinds.add("failed")
                lines.append(f"FAILED on {run_label(rec)}: {c.get('reason', '')}")
            elif c["mode"] != "real":
                kinds.add("fake")
                lines.append(f"checked on fake CUDA ({run_label(rec)}): shapes and dtypes, no kernel ran")
            elif _accelerated(rec):
                kinds.add("hardware")
                lines.append(f"passed on {run_label(rec)}")
            else:
                kinds.add("cpu")
                lines.append(f"passed on CPU ({run_label(rec)})")
    kind = next((k for k in ("hardware", "failed", "cpu", "fake") if k in kinds), "none")
    return kind, lines or ["nothing has run it yet"]


def summary_line(paths: Sequence[Any], records: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """"0 of 31 hardware paths have run on hardware; 7 checked on fake CUDA; 3 on CPU"."""
    kinds = [(bool(p.needs), classify(p, records)[0]) for p in paths]
    hw = [k for needs, k in kinds if needs]
    n_fake = sum(k == "fake" for _n, k in kinds)
    failed = sum(k == "failed" for _n, k in kinds)
    line = (f"{sum(k == 'hardware' for k in hw)} of {len(hw)} hardware paths have run on hardware; "
            f"{n_fake} checked on fake CUDA; {sum(k == 'cpu' for k in hw)} on CPU")
    return line + (f"; {failed} failed" if failed else "")


# ------------------------------------------------------------------------------------------ the directive


def _entries(paths: Sequence[Any], records: Sequence[tuple[str, dict[str, Any]]]):
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


def render(paths: Sequence[Any], records: Sequence[tuple[str, dict[str, Any]]]) -> list:
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
        out.append(nodes.raw("", f"<details class=\"pt215-hardware-runs\"><summary>Not run on the hardware they "
                                 f"need ({len(rest)}): fake CUDA, CPU, or nothing yet</summary>", format="html"))
        out.append(_entries(rest, records))
        out.append(nodes.raw("", "</details>", format="html"))
    return out




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
            return render([p for p in PATHS if chapter is None or p.chapter == chapter], records)

    app.add_directive("hardware-runs", HardwareRuns)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
