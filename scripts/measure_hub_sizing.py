"""Measure what one workshop participant needs per chapter: processes, cores, memory, disk ("Running a workshop").

    .venv/bin/python scripts/measure_hub_sizing.py            # every chapter notebook
    .venv/bin/python scripts/measure_hub_sizing.py chapters/02-flight-recorder/02-1-recorder.ipynb
    # N participants at once: each notebook alone, then N copies of it started together (one process each)
    .venv/bin/python scripts/measure_hub_sizing.py --concurrent 6 --out data/workshop/concurrent-runs.json NB...

Each notebook is executed once with nbclient (fresh kernel, in its chapter folder, like scripts/regen.py)
while a sampler thread walks the kernel's process tree with psutil every 0.2 s: the peak number of live
processes (the kernel plus the ranks a multi-rank demo starts), the peak sum of their resident memory (RSS,
which counts pages shared between processes once per process) and of their proportional set size (PSS, which
splits shared pages between the processes sharing them: the memory they really take), the
CPU time they used (average and peak busy cores) and the peak size of the scratch folder the notebook's
temporary files go to (TMPDIR), plus what it left in its chapter folder. Per-cell wall times come from
nbclient's timing metadata, and the longest stretch each cell runs without showing anything (no output, no
progress update) from the kernel's messages. The result, with provenance (date, torch, CPU, cores), is written to
data/workshop/hub-sizing.json, which the hub-sizing page renders. Nothing is written back to the notebooks.

With `--concurrent N`, each notebook is measured alone and then as N participants running it at the same time
(N child processes of this script, each executing its own copy with its own kernel and scratch folder); the
result, with the conditions (cores, load average before and after, available memory), goes to the `--out`
file, which `pt215.site.agenda` reads for the run times of the agenda.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "workshop" / "hub-sizing.json"
INTERVAL_S = 0.2


def _tree_size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for p in folder.rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts:
            st = p.stat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime)
    return out


def _pss(p: psutil.Process) -> int:
    """Proportional set size (Linux smaps_rollup); RSS where the platform has no PSS."""
    try:
        return int(getattr(p.memory_full_info(), "pss", 0)) or p.memory_info().rss
    except (psutil.AccessDenied, AttributeError):
        return p.memory_info().rss


class _Sampler(threading.Thread):
    """Samples every process below this one (the kernel and what it starts)."""

    def __init__(self, scratch: Path):
        super().__init__(daemon=True)
        self.scratch = scratch
        self.stop = threading.Event()
        self.max_procs = 0
        self.max_rss = 0
        self.max_pss = 0
        self.max_scratch = 0
        self.cpu_by_pid: dict[int, float] = {}
        self.busy: list[tuple[float, float]] = []  # (time, total cpu seconds so far)

    def run(self) -> None:
        me = psutil.Process()
        n = 0
        while not self.stop.is_set():
            procs = me.children(recursive=True)
            rss = 0
            pss = 0
            alive = 0
            for p in procs:
                try:
                    with p.oneshot():
                        if p.status() == psutil.STATUS_ZOMBIE:
                            continue
                        rss += p.memory_info().rss
                        pss += _pss(p)
                        t = p.cpu_times()
                        self.cpu_by_pid[p.pid] = max(self.cpu_by_pid.get(p.pid, 0.0), t.user + t.system)
                        alive += 1
                except psutil.Error:
                    continue
            self.max_procs = max(self.max_procs, alive)
            self.max_rss = max(self.max_rss, rss)
            self.max_pss = max(self.max_pss, pss)
            self.busy.append((time.monotonic(), sum(self.cpu_by_pid.values())))
            if n % 5 == 0:  # the scratch folder is walked once a second
                self.max_scratch = max(self.max_scratch, _tree_size(self.scratch))
            n += 1
            self.stop.wait(INTERVAL_S)

    def peak_cores(self, window_s: float = 2.0) -> float:
        """Highest CPU use over any `window_s` window, in cores."""
        best = 0.0
        j = 0
        for i in range(len(self.busy)):
            while self.busy[i][0] - self.busy[j][0] > window_s:
                j += 1
            dt_ = self.busy[i][0] - self.busy[j][0]
            if dt_ >= window_s * 0.5:
                best = max(best, (self.busy[i][1] - self.busy[j][1]) / dt_)
        return best


class _TimedClient(NotebookClient):
    """Records when each cell starts, shows something (output, display update) and ends: its silent stretches."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks: dict[int, list[float]] = {}
        self.on_cell_execute = lambda cell, cell_index: self.marks.setdefault(cell_index, []).append(time.monotonic())
        self.on_cell_executed = lambda cell, cell_index, execute_reply: self.marks[cell_index].append(
            time.monotonic())

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") in ("stream", "display_data", "update_display_data", "execute_result", "error"):
            self.marks.setdefault(cell_index, []).append(time.monotonic())
        return super().process_message(msg, cell, cell_index)

    def longest_silence(self, cell_index: int) -> float:
        marks = sorted(self.marks.get(cell_index, []))
        return max((b - a for a, b in zip(marks, marks[1:], strict=False)), default=0.0)


def _cell_seconds(cell) -> float | None:
    timing = cell.metadata.get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return None
    parse = dt.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def measure(path: Path, timeout: int) -> dict:
    """Execute one notebook and return its measured needs."""
    nb = nbformat.read(path, as_version=4)
    scratch = Path(tempfile.mkdtemp(prefix="pt215-hub-"))
    old_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    before = _snapshot(path.parent)
    sampler = _Sampler(scratch)
    sampler.start()
    start = time.monotonic()
    client = _TimedClient(nb, timeout=timeout, kernel_name="python3", record_timing=True, allow_errors=True,
                          resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        wall = time.monotonic() - start
        sampler.stop.set()
        sampler.join()
        if old_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmp
        shutil.rmtree(scratch, ignore_errors=True)
    after = _snapshot(path.parent)
    left = sum(size for name, (size, mtime) in after.items() if before.get(name) != (size, mtime))
    cpu = sum(sampler.cpu_by_pid.values())
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            secs = _cell_seconds(cell)
            if secs is not None:
                cells.append({"cell": i, "seconds": round(secs, 1), "silent_s": round(client.longest_silence(i), 1)})
    return {
        "notebook": _name(path),
        "chapter": path.parent.name,
        "wall_s": round(wall, 1),
        "peak_processes": sampler.max_procs,
        "peak_rss_mib": round(sampler.max_rss / 2**20),
        "peak_pss_mib": round(sampler.max_pss / 2**20),
        "cpu_s": round(cpu, 1),
        "avg_cores": round(cpu / wall, 2) if wall > 0 else 0.0,
        "peak_cores": round(sampler.peak_cores(), 2),
        "peak_scratch_mib": round(sampler.max_scratch / 2**20, 1),
        "written_to_chapter_mib": round(left / 2**20, 1),
        "cells_over_10s": [c for c in cells if c["seconds"] > 10],
        "cells_silent_over_10s": [c for c in cells if c["silent_s"] > 10],
        "cells_with_errors": [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                              and any(o.get("output_type") == "error" for o in c.get("outputs", []))],
        "errors": [{"cell": i, "error": f"{o.get('ename')}: {str(o.get('evalue', '')).splitlines()[0][:200]}"
                    if o.get("evalue") else str(o.get("ename"))}
                   for i, c in enumerate(nb.cells) if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "error"],
    }


def provenance() -> dict:
    import torch

    return {
        "date": dt.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "interval_s": INTERVAL_S,
        "command": "python scripts/measure_hub_sizing.py",
    }


def conditions() -> dict:
    """What else the machine was doing: load average and available memory, now."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"load_average_1_5_15": [round(x, 2) for x in load],
            "memory_available_gib": round(psutil.virtual_memory().available / 2**30, 1)}


def concurrent(paths: list[Path], n: int, timeout: int, budget_s: float = float("inf"),
               on_row=lambda rows: None) -> list[dict]:
    """Each notebook alone, then `n` copies started together, each in its own child process. No new notebook
    starts after `budget_s` seconds; `on_row(rows)` is called after each notebook (to write what is done)."""
    out: list[dict] = []
    start = time.monotonic()
    for path in paths:
        if time.monotonic() - start > budget_s:
            print(f"budget of {budget_s / 60:g} min spent: {path.name} and the rest not measured", file=sys.stderr)
            break
        before = conditions()
        solo = measure(path, timeout)
        print(json.dumps({"solo": solo["notebook"], "wall_s": solo["wall_s"]}), flush=True)
        folder = Path(tempfile.mkdtemp(prefix="pt215-conc-"))
        try:
            procs = [subprocess.Popen([sys.executable, __file__, "--child", str(folder / f"p{i}.json"),
                                       "--timeout", str(timeout), str(path)]) for i in range(n)]
            for proc in procs:
                proc.wait()
            rows = [json.loads((folder / f"p{i}.json").read_text())
                    for i in range(n) if (folder / f"p{i}.json").is_file()]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        walls = sorted(r["wall_s"] for r in rows)
        row = {
            "notebook": solo["notebook"],
            "participants": n,
            "completed": len(rows),
            "solo_wall_s": solo["wall_s"],
            "solo_peak_pss_mib": solo["peak_pss_mib"],
            "solo_peak_rss_mib": solo["peak_rss_mib"],
            "concurrent_wall_s": walls,
            "median_wall_s": round(statistics.median(walls), 1) if walls else None,
            "slowdown": round(statistics.median(walls) / solo["wall_s"], 2) if walls else None,
            "peak_pss_mib_per_participant": sorted(r["peak_pss_mib"] for r in rows),
            "participants_with_cell_errors": sum(bool(r["cells_with_errors"]) for r in rows),
            "errors": sorted({f"cell {e['cell']}: {e['error']}" for r in [solo, *rows] for e in r.get("errors", [])}),
            "solo_errors": [f"cell {e['cell']}: {e['error']}" for e in solo.get("errors", [])],
            "conditions_before": before,
            "conditions_after": conditions(),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
        on_row(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks (.ipynb); default: every chapter notebook")
    p.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    p.add_argument("--out", type=Path, default=OUT, help="JSON file to write (default data/workshop/hub-sizing.json)")
    p.add_argument("--concurrent", type=int, default=0, metavar="N",
                   help="measure N participants running each notebook at once (write to --out)")
    p.add_argument("--budget-min", type=float, default=15.0,
                   help="with --concurrent: start no new notebook after this many minutes (default 15)")
    p.add_argument("--note", default="", help="a sentence on the conditions of this run (e.g. a shared, loaded "
                   "machine), added to the file's provenance notes; earlier notes are kept")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one participant of --concurrent
    a = p.parse_args(argv)
    paths = [n.resolve() for n in a.notebooks] or sorted(ROOT.glob("chapters/*/[0-9]*.ipynb"))
    for n in paths:
        if n.suffix != ".ipynb" or not n.is_file():
            p.error(f"notebooks must be existing .ipynb files; got {n}")
    if a.child:
        a.child.write_text(json.dumps(measure(paths[0], a.timeout)))
        return 0
    if a.concurrent:
        if a.concurrent < 2:
            p.error(f"--concurrent must be at least 2 participants; got {a.concurrent}")
        if a.out == OUT:
            p.error("--concurrent needs --out (e.g. data/workshop/concurrent-runs.json), not the hub-sizing file")
        prov = {**provenance(), "participants": a.concurrent,
                "command": "python scripts/measure_hub_sizing.py --concurrent "
                           f"{a.concurrent} --budget-min {a.budget_min:g} --out {_rel(a.out)} "
                           + " ".join(_rel(n) for n in paths)}

        def write(rows: list[dict]) -> None:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps({"provenance": prov, "notebooks": rows}, indent=1) + "\n")
            print(f"wrote {_rel(a.out)} ({len(rows)} notebooks)", file=sys.stderr)

        concurrent(paths, a.concurrent, a.timeout, a.budget_min * 60, write)
        return 0
    at_start = conditions()
    rows: list[dict] = []
    notes: list[str] = []
    if a.out.is_file() and a.notebooks:  # measuring a few notebooks updates their rows only
        old = json.loads(a.out.read_text())
        rows = [r for r in old["notebooks"] if r["notebook"] not in {_name(n) for n in paths}]
        notes = list(old["provenance"].get("notes", []))
    if a.note:
        notes.append(f"{dt.date.today().isoformat()}: {a.note}")
    command = "python scripts/measure_hub_sizing.py " + " ".join(_name(n) for n in paths)
    for n in paths:
        before = conditions()
        row = {**measure(n, a.timeout), "measured": dt.date.today().isoformat(), "command": command,
               "conditions_before": before}
        print(json.dumps(row), flush=True)
        rows.append(row)
    rows.sort(key=lambda r: r["notebook"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    prov = {**provenance(), "conditions_at_start": at_start, "conditions_at_end": conditions(),
            **({"notes": notes} if notes else {})}
    a.out.write_text(json.dumps({"provenance": prov, "notebooks": rows}, indent=1) + "\n")
    print(f"wrote {_rel(a.out)}", file=sys.stderr)
    return 0


def _name(path: Path) -> str:
    """A notebook's name in the data files: its path in the checkout, or `chapters/<its folder>/<file>` for a copy
    measured outside it (a chapter not yet in this checkout, copied to a scratch folder with its scripts)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else f"chapters/{path.parent.name}/{path.name}"


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


if __name__ == "__main__":
    sys.exit(main())
