"""Measure what one workshop participant needs per chapter: processes, cores, memory, disk ("Running a workshop").

    .venv/bin/python scripts/measure_hub_sizing.py            # every chapter notebook
    .venv/bin/python scripts/measure_hub_sizing.py chapters/02-flight-recorder/02-1-recorder.ipynb

Each notebook is executed once with nbclient (fresh kernel, in its chapter folder, like scripts/regen.py)
while a sampler thread walks the kernel's process tree with psutil every 0.2 s: the peak number of live
processes (the kernel plus the ranks a multi-rank demo starts), the peak sum of their resident memory, the
CPU time they used (average and peak busy cores) and the peak size of the scratch folder the notebook's
temporary files go to (TMPDIR), plus what it left in its chapter folder. Per-cell wall times come from
nbclient's timing metadata, and the longest stretch each cell runs without showing anything (no output, no
progress update) from the kernel's messages. The result, with provenance (date, torch, CPU, cores), is written to
data/workshop/hub-sizing.json, which the hub-sizing page renders. Nothing is written back to the notebooks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
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


class _Sampler(threading.Thread):
    """Samples every process below this one (the kernel and what it starts)."""

    def __init__(self, scratch: Path):
        super().__init__(daemon=True)
        self.scratch = scratch
        self.stop = threading.Event()
        self.max_procs = 0
        self.max_rss = 0
        self.max_scratch = 0
        self.cpu_by_pid: dict[int, float] = {}
        self.busy: list[tuple[float, float]] = []  # (time, total cpu seconds so far)

    def run(self) -> None:
        me = psutil.Process()
        n = 0
        while not self.stop.is_set():
            procs = me.children(recursive=True)
            rss = 0
            alive = 0
            for p in procs:
                try:
                    with p.oneshot():
                        if p.status() == psutil.STATUS_ZOMBIE:
                            continue
                        rss += p.memory_info().rss
                        t = p.cpu_times()
                        self.cpu_by_pid[p.pid] = max(self.cpu_by_pid.get(p.pid, 0.0), t.user + t.system)
                        alive += 1
                except psutil.Error:
                    continue
            self.max_procs = max(self.max_procs, alive)
            self.max_rss = max(self.max_rss, rss)
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
        "notebook": str(path.relative_to(ROOT)),
        "chapter": path.parent.name,
        "wall_s": round(wall, 1),
        "peak_processes": sampler.max_procs,
        "peak_rss_mib": round(sampler.max_rss / 2**20),
        "cpu_s": round(cpu, 1),
        "avg_cores": round(cpu / wall, 2) if wall > 0 else 0.0,
        "peak_cores": round(sampler.peak_cores(), 2),
        "peak_scratch_mib": round(sampler.max_scratch / 2**20, 1),
        "written_to_chapter_mib": round(left / 2**20, 1),
        "cells_over_10s": [c for c in cells if c["seconds"] > 10],
        "cells_silent_over_10s": [c for c in cells if c["silent_s"] > 10],
        "cells_with_errors": [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                              and any(o.get("output_type") == "error" for o in c.get("outputs", []))],
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks (.ipynb); default: every chapter notebook")
    p.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    p.add_argument("--out", type=Path, default=OUT, help="JSON file to write (default data/workshop/hub-sizing.json)")
    a = p.parse_args(argv)
    paths = [n.resolve() for n in a.notebooks] or sorted(ROOT.glob("chapters/*/[0-9]*.ipynb"))
    for n in paths:
        if n.suffix != ".ipynb" or not n.is_file():
            p.error(f"notebooks must be existing .ipynb files; got {n}")
    rows = []
    if a.out.is_file() and a.notebooks:  # measuring a few notebooks updates their rows only
        rows = [r for r in json.loads(a.out.read_text())["notebooks"]
                if r["notebook"] not in {str(n.relative_to(ROOT)) for n in paths}]
    for n in paths:
        row = measure(n, a.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    rows.sort(key=lambda r: r["notebook"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"provenance": provenance(), "notebooks": rows}, indent=1) + "\n")
    print(f"wrote {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
