"""Benchmark `python -m pt215.upgrade` on a large tree against the floor of reading it (chapter 7).

    .venv/bin/python scripts/bench_upgrade.py --root /tmp/repos/Megatron-LM [--rounds 3] [--out results.json]

In one process and one run, alternating, for `--rounds` rounds: (a) the floor, reading every file the scanner
would read and `ast.parse`-ing every Python file once; (b) the scan of the same tree (`pt215.upgrade.scan`). Both
are timed by the CPU time of the (single) thread that does the work, `pt215.timing.thread_cpu_samples`, so that
other processes on a shared machine do not enter the ratio; the wall-clock times are reported next to them. It
prints the median of each, their ratio (the scanner's promise: at most 3x the floor on a 3,000-file tree), the
slowest files (each scanned on its own; the promise: none above 1 s of CPU), and writes the figures as JSON with
`--out`. Compare the ratio, not the seconds: they are this machine's.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import warnings
from pathlib import Path

from pt215.timing import Stopwatch, thread_cpu_samples
from pt215.upgrade import iter_files, scan
from pt215.upgrade.scanner import _File, _read, _scan_file, kind_of


def read_and_parse(files: list[Path]) -> tuple[int, int]:
    """Read every file (bytes) and parse every Python file once: (bytes read, Python files parsed)."""
    n_bytes = n_py = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning from odd escape sequences in third-party code
        for p in files:
            try:
                data = p.read_bytes()
            except OSError:
                continue
            n_bytes += len(data)
            if p.suffix in (".py", ".pyi"):
                try:
                    ast.parse(data)
                    n_py += 1
                except (SyntaxError, ValueError, RecursionError, MemoryError):
                    pass
    return n_bytes, n_py


def timed(fn) -> tuple[float, float, object]:  # noqa: ANN001 - any zero-argument callable
    """(CPU seconds of this thread, wall seconds, fn's result) of one call."""
    box: list[object] = []
    with Stopwatch() as sw:
        cpu = thread_cpu_samples(lambda: box.append(fn()), iters=1)[0]
    return cpu, sw.seconds, box[0]


def scan_file_alone(p: Path) -> None:
    kind = kind_of(p) or "shell"
    text, enc, _ = _read(p, kind)
    if text is not None:
        _scan_file(_File(str(p), text, kind, enc), [], on_disk=True)


def per_file(files: list[Path], top: int) -> list[tuple[float, float, str, int]]:
    """Each file scanned on its own: the `top` slowest by CPU (CPU s, wall s, path, size in bytes)."""
    out = []
    for p in files:
        cpu, wall, _ = timed(lambda p=p: scan_file_alone(p))
        out.append((cpu, wall, str(p), p.stat().st_size if p.exists() else 0))
    return sorted(out, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the tree to scan (a repository's work tree)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of floor and scan (default 3)")
    ap.add_argument("--top", type=int, default=5, help="slowest files to list (default 5)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        ap.error(f"--root: {args.root} is not a directory")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    files = iter_files([root])
    rows: dict[str, list[float]] = {"floor_cpu": [], "floor_wall": [], "scan_cpu": [], "scan_wall": []}
    for _ in range(args.rounds):
        cpu, wall, (n_bytes, n_py) = timed(lambda: read_and_parse(files))
        rows["floor_cpu"].append(cpu)
        rows["floor_wall"].append(wall)
        cpu, wall, report = timed(lambda: scan([root]))
        rows["scan_cpu"].append(cpu)
        rows["scan_wall"].append(wall)
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = round(med["scan_cpu"] / med["floor_cpu"], 2) if med["floor_cpu"] else None
    slow = per_file(files, args.top)
    result = {"root": root.name, "files": report.n_files, "python_files_parsed": n_py, "bytes": n_bytes,
              "findings": len(report.findings), "rounds": args.rounds, "clock": "thread CPU time (wall beside it)",
              **{f"{k}_s": round(v, 3) for k, v in med.items()}, "ratio": ratio,
              "wall_ratio": round(med["scan_wall"] / med["floor_wall"], 2) if med["floor_wall"] else None,
              "slowest": [{"path": Path(p).relative_to(root).as_posix(), "cpu_s": round(c, 3), "wall_s": round(w, 3),
                           "bytes": b} for c, w, p, b in slow]}
    worst = result["slowest"][0]["cpu_s"] if result["slowest"] else 0.0
    result["summary"] = (f"{report.n_files} files, CPU time: floor {med['floor_cpu']:.1f} s, scan "
                         f"{med['scan_cpu']:.1f} s, ratio {ratio} ×; slowest file {worst:.2f} s")
    print(f"{root.name}: {report.n_files} files ({n_py} Python parsed, {n_bytes / 1e6:.1f} MB), "
          f"{len(report.findings)} findings")
    print(f"CPU: floor (read + ast.parse) median {med['floor_cpu']:.2f} s, scan median {med['scan_cpu']:.2f} s, "
          f"ratio {ratio} (promise: <= 3); wall: {med['floor_wall']:.2f} s and {med['scan_wall']:.2f} s")
    for s in result["slowest"]:
        print(f"  {s['cpu_s']:.3f} s CPU ({s['wall_s']:.3f} s wall)  {s['path']} ({s['bytes'] / 1e3:.0f} kB)")
    ok = (ratio or 0) <= 3 and all(s["cpu_s"] <= 1 for s in result["slowest"])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
