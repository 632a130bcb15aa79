"""Re-execute chapter notebooks and write their reference outputs (the paired .ipynb).

    .venv/bin/python scripts/regen.py chapters/01-collectives-nccl2/01-1-collectives-tour.md [...]
    .venv/bin/python scripts/regen.py --all

Each notebook runs in its own folder with a fresh kernel; the .ipynb gets the outputs plus a
`pt215.verified` stamp (torch, hardware, Python, date) that the website shows as "last verified".
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def notebooks() -> list[Path]:
    return sorted(ROOT.glob("chapters/*/[0-9]*.md"))


def regen(src: Path, timeout: int) -> float:
    import torch

    from pt215.hardware import summary

    nb = jupytext.read(src)
    nb.metadata.setdefault("kernelspec", {"display_name": "Python 3", "language": "python", "name": "python3"})
    start = time.monotonic()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(src.parent)}}).execute()
    elapsed = time.monotonic() - start
    meta = nb.metadata.setdefault("pt215", {})
    meta["verified"] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hardware": summary(),
        "date": dt.date.today().isoformat(),
        "seconds": round(elapsed, 1),
    }
    out = src.with_suffix(".ipynb")
    nbformat.write(nb, out)
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="*", type=Path, help="notebook sources (.md); .ipynb names are accepted too")
    p.add_argument("--all", action="store_true", help="every chapter notebook")
    p.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    a = p.parse_args()
    srcs = notebooks() if a.all else [s.with_suffix(".md") for s in a.sources]
    if not srcs:
        p.error("name notebook sources or pass --all")
    for s in srcs:
        if not s.is_file():
            p.error(f"no notebook source {s}")
    for s in srcs:
        took = regen(s.resolve(), a.timeout)
        print(f"{s}: executed in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
