"""Measure what chapter 0's "Measured results" table shows and write it to data/00-before-you-start/.

    .venv/bin/python scripts/measure_setup.py            # writes data/00-before-you-start/measured.csv (+ .json)

Measures, on this machine: the size of `.venv`, the wall time of a 4-rank `hello.py` launch (median of 3), and
the wall time of executing notebook 0.1 end to end (jupytext + nbclient, as `scripts/regen.py` does, without
writing it). The CSV is what the chapter page renders (`csv-table :file:`); the JSON beside it keeps the machine
and date it was measured on.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "00-before-you-start"


def tree_bytes(path: Path) -> int:
    """Bytes of every regular file under `path` (what `du -sb` counts, links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            p = Path(dirpath, name)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def hello_seconds(repeats: int) -> float:
    from pt215.timing import Stopwatch

    times = []
    for _ in range(repeats):
        with Stopwatch() as sw:
            proc = subprocess.run([sys.executable, "-m", "pt215.launch", "-n", "4", "--timeout", "300",
                                   str(ROOT / "chapters/00-before-you-start/hello.py")],
                                  capture_output=True, text=True, timeout=360)
        if proc.returncode != 0:
            raise SystemExit(f"measure_setup: the hello.py launch failed (exit {proc.returncode}):\n"
                             f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        times.append(sw.seconds)
    return statistics.median(times)


def notebook_seconds() -> float:
    import jupytext
    from nbclient import NotebookClient

    from pt215.timing import Stopwatch

    src = ROOT / "chapters/00-before-you-start/00-1-environment.md"
    nb = jupytext.read(src)
    with tempfile.TemporaryDirectory() as tmp, Stopwatch() as sw:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(src.parent)}}).execute(cwd=tmp)
    return sw.seconds


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the virtual environment to size")
    ap.add_argument("--repeats", type=int, default=3, help="launches of hello.py (the median is kept)")
    a = ap.parse_args(argv)
    if not a.venv.is_dir():
        ap.error(f"--venv must be a virtual environment folder, got {a.venv}")
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    venv_gb = tree_bytes(a.venv) / 1e9
    hello = hello_seconds(a.repeats)
    notebook = notebook_seconds()
    rows = [
        ("a 4-rank `hello.py` job, start to end (median of 3)", f"{hello:.1f} s",
         "`.venv/bin/python -m pt215.launch -n 4 chapters/00-before-you-start/hello.py`"),
        ("notebook 0.1, executed end to end", f"{notebook:.0f} s",
         "`.venv/bin/python scripts/regen.py chapters/00-before-you-start/00-1-environment.md`"),
        ("`.venv` on Linux x86-64 (the CUDA build of torch)", f"{venv_gb:.1f} GB",
         "`du -sh .venv` after `bash scripts/setup.sh`"),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / "measured.csv.tmp"
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["What", "Measured", "Command"])
        w.writerows(rows)
    tmp.replace(OUT / "measured.csv")
    import torch

    meta = {"command": "python scripts/measure_setup.py", "date": dt.date.today().isoformat(),
            "machine": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "load_average_1min": round(os.getloadavg()[0], 1), "rows": [list(r[:2]) for r in rows]}
    (OUT / "measured.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
