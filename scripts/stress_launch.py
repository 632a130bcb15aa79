"""Launch multi-rank chapter scripts many times and count failures: the check that teardown never flakes.

    .venv/bin/python scripts/stress_launch.py                    # every multi-rank CPU script, 20 runs each
    .venv/bin/python scripts/stress_launch.py --runs 5 collectives.py hello.py

Each launch goes through `pt215.launch.run` (no retries) in a fresh temporary folder (what a script writes stays
out of the book), with the small arguments of tests/test_chapter_scripts.py (the one table of how to run each
chapter script small). Prints one line per script (runs, failures, timeouts, median seconds) and exits 1 if
any launch failed. Long (minutes per script on 2 cores): run it by hand
after touching a script or the launcher, not in the normal test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from pt215.book_files import chapter_script
from pt215.launch import LaunchTimeoutError, RankFailedError, run
from pt215.timing import Stopwatch

ROOT = Path(__file__).resolve().parents[1]


def _table() -> dict[str, tuple[int, list[str]]]:
    """Script name -> (ranks, arguments): the small runs of tests/test_chapter_scripts.py that use > 1 rank."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_chapter_scripts import SMALL
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return {Path(name).name: (nproc, args) for name, (nproc, args, _) in SMALL.items() if nproc > 1}


SCRIPTS = _table()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scripts", nargs="*", help=f"script names (default: all of {', '.join(SCRIPTS)})")
    p.add_argument("--runs", type=int, default=20, help="launches per script (default 20)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per launch (default 180)")
    a = p.parse_args(argv)
    unknown = [s for s in a.scripts if s not in SCRIPTS]
    if unknown:
        p.error(f"unknown script(s) {unknown}; choose from {list(SCRIPTS)}")
    if a.runs < 1:
        p.error("--runs must be >= 1")
    failed_any = False
    for name in a.scripts or list(SCRIPTS):
        nproc, args = SCRIPTS[name]
        path = chapter_script(name)
        fails, timeouts, secs = 0, 0, []
        for _ in range(a.runs):
            clock = Stopwatch()
            try:
                with tempfile.TemporaryDirectory(prefix="pt215-stress-") as work:
                    run(path, nproc, args=args, timeout=a.timeout, cwd=work, stream=False, show=False)
            except RankFailedError as e:
                fails += 1
                print(f"  {name}: {str(e).splitlines()[0]}", file=sys.stderr)
            except LaunchTimeoutError:
                timeouts += 1
            secs.append(clock.seconds)
        failed_any |= bool(fails or timeouts)
        print(f"{name:22s} {nproc} ranks  runs {a.runs:3d}  failed {fails:2d}  timed out {timeouts:2d}  "
              f"median {statistics.median(secs):5.1f} s", flush=True)
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
