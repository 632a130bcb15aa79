"""Launch multi-rank chapter scripts many times and count failures: the check that teardown never flakes.

    .venv/bin/python scripts/stress_launch.py                    # every multi-rank CPU script, 20 runs each
    .venv/bin/python scripts/stress_launch.py --runs 5 collectives.py hello.py

Each launch goes through `pt215.launch.run` (no retries) in a fresh temporary folder (what a script writes stays
out of the book), with the arguments the chapter's notebook uses. Prints one line per script (runs, failures,
timeouts, median seconds) and exits 1 if any launch failed. Long (minutes per script on 2 cores): run it by hand
after touching a script or the launcher, not in the normal test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from pt215.book_files import chapter_script
from pt215.launch import LaunchTimeoutError, RankFailedError, run

# script -> (ranks, arguments): the CPU launches the notebooks make.
SCRIPTS: dict[str, tuple[int, list[str]]] = {
    "hello.py": (4, []),
    "collectives.py": (4, []),
    "nccl_only.py": (2, []),
    "reconfigure.py": (3, []),
    "bandwidth.py": (2, ["-e", "64K", "--memcpy-bytes", "1M", "--rounds", "2"]),
    "fr_env_probe.py": (1, ["--root", "."]),
    "fr_overhead.py": (2, ["--iters", "20"]),
    "hang_lab.py": (2, ["--case", "healthy"]),
    "api_tour.py": (2, ["--store", "tcp"]),
    "kv_migrate.py": (2, ["--layers", "2", "--heads", "2", "--head-dim", "8", "--seq", "32"]),
    "fsdp_override.py": (2, []),
    "fsdp_accum_dcp.py": (2, ["--micro", "2"]),
    "fsdp_experiment.py": (2, ["--steps", "2"]),
    "fsdp_async_pipeline.py": (4, ["--micro", "3"]),
    "debug_server.py": (3, ["--dump-dir", "dumps"]),
    "reduce_dtype_probe.py": (2, []),
}


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
            start = time.monotonic()
            try:
                with tempfile.TemporaryDirectory(prefix="pt215-stress-") as work:
                    run(path, nproc, args=args, timeout=a.timeout, cwd=work, stream=False, show=False)
            except RankFailedError as e:
                fails += 1
                print(f"  {name}: {str(e).splitlines()[0]}", file=sys.stderr)
            except LaunchTimeoutError:
                timeouts += 1
            secs.append(time.monotonic() - start)
        failed_any |= bool(fails or timeouts)
        print(f"{name:22s} {nproc} ranks  runs {a.runs:3d}  failed {fails:2d}  timed out {timeouts:2d}  "
              f"median {statistics.median(secs):5.1f} s", flush=True)
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
