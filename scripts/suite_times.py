"""Where the test suite's time goes: seconds per test file (a notebook is one file), from one measured run.

    .venv/bin/python scripts/suite_times.py                 # run the README's test command with --durations=0
    .venv/bin/python scripts/suite_times.py --log run.log   # read a log such a run wrote instead
    .venv/bin/python scripts/suite_times.py --write         # ... and store the table in tests/durations.json

Prints each file's total (setup + call + teardown of its tests), its share of the total, and the wall time the
run took; with `--write` the table becomes the order the test workers take files in, longest first
(tests/conftest.py). A benchmark, not a test: the numbers depend on the machine and its load, so nothing asserts
on them.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
LINE = re.compile(r"^\s*(?P<s>[\d.]+)s (?:call|setup|teardown)\s+(?P<id>\S+)")
# pytest's closing line, with its ===== border or without it (-q)
SUMMARY = re.compile(r"^=*\s*(?P<text>\d+ (?:passed|failed)\b.*?) in (?P<s>[\d.]+)s", re.M)


def per_file(log: str) -> Counter[str]:
    """{file: seconds} from pytest's `--durations=0` lines."""
    out: Counter[str] = Counter()
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            out[m.group("id").split("::", 1)[0]] += float(m.group("s"))
    return out


def table(times: Counter[str], wall: float | None) -> str:
    total = sum(times.values())
    rows = [f"{'seconds':>8} {'share':>6}  file"]
    rows += [f"{s:8.1f} {100 * s / total:5.1f}%  {f}" for f, s in times.most_common()]
    rows.append(f"{total:8.1f} 100.0%  all files (worker-seconds)")
    if wall is not None:
        rows.append(f"{wall:8.1f}         wall time of the run")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--log", type=Path, help="read this pytest log (run with --durations=0) instead of running")
    p.add_argument("--write", action="store_true", help="store the per-file seconds in tests/durations.json")
    p.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    a = p.parse_args(argv)
    if a.log is not None:
        if not a.log.is_file():
            p.error(f"--log: no such file: {a.log}")
        log, wall = a.log.read_text(encoding="utf-8", errors="replace"), None
        cpu, returncode = None, 0
    else:
        start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "pytest"), "--durations=0", "-q", *a.pytest_args],
                              cwd=ROOT, capture_output=True, text=True)
        wall, log = time.monotonic() - start, proc.stdout + proc.stderr
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the second way of seeing the run: CPU time of every process it started (reaped ones), against the wall
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        returncode = proc.returncode
    times = per_file(log)
    if not times:
        print("suite_times: no --durations lines found (was the run started with --durations=0?)", file=sys.stderr)
        return 2
    summaries = list(SUMMARY.finditer(log))
    m = summaries[-1] if summaries else None
    if a.log is not None and m and re.search(r"\b(?:failed|errors?)\b", m.group("text")):
        returncode = 1  # a log of a run that failed
    print(table(times, wall if wall is not None else (float(m.group("s")) if m else None)))
    if cpu is not None and wall:
        print(f"{cpu:8.1f}         CPU seconds, all its processes (user + sys): {cpu / wall:.2f} cores busy on average")
    if m:
        print(f"pytest: {m.group('text')} in {m.group('s')} s")
    if returncode != 0:
        print(f"suite_times: the run failed (pytest exit {returncode}): its times are not a baseline", file=sys.stderr)
        return 1
    if a.write:
        DURATIONS.write_text(json.dumps({f: round(s, 1) for f, s in sorted(times.items())}, indent=1) + "\n")
        print(f"wrote {DURATIONS.relative_to(ROOT)} ({len(times)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
