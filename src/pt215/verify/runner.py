"""`python -m pt215.verify`: run every hardware-gated path of the book that this machine supports (chapters 0-6, 8, 9).

    python -m pt215.verify --list                  # every gated path: id, chapter, needs
    python -m pt215.verify                         # run what this machine supports, skip the rest, print a table
    python -m pt215.verify --out run.json          # ... and write the JSON record (data/hardware-runs/README.md)
    python -m pt215.verify --only ch1.             # only the paths whose id contains "ch1."
    python -m pt215.verify --only boundary         # only the run to the hardware boundary (below)

The paths are the catalogue `pt215.verify.paths.PATHS`; each runs its check in `pt215.verify.checks`, the code
its notebook cell or chapter script runs, and asserts on the results. A path whose needs (`pt215.hardware`
vocabulary) the machine does not meet is skipped with the reason. Paths marked fake CUDA run everywhere: the
CUDA calls on FakeTensors (`pt215.verify.fake_cuda`), shapes and dtypes checked, no kernel run. Exit code 1 if any
check failed.

Then, on any machine, the run to the boundary (`pt215.verify.boundary`): every command a notebook cell launches
(`pt215.launch.run("X.py", args=[...])`, read from the notebooks' code cells) runs as rank 0 on CPU through
the script's argument checks and set-up, up to its first hardware call; a command that fails before it makes
the exit code 1. `--skip-boundary` leaves it out; `--only` runs it only for `--only boundary`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pt215 import hardware
from pt215.hardware import HardwareReport
from pt215.timing import Stopwatch
from pt215.verify import checks as path_checks
from pt215.verify import fake_cuda
from pt215.verify.paths import PATHS, CheckSkipped, GatedPath, Outcome
from pt215.verify.record import (
    REAL,
    BoundaryFailure,
    BoundaryRecord,
    CheckRecord,
    GpuRecord,
    MachineRecord,
    RunRecord,
)

__all__ = ["PATHS", "GatedPath", "Outcome", "format_table", "machine_record", "main", "run_boundary", "run_paths",
           "status_text"]


def machine_record(hw: HardwareReport) -> MachineRecord:
    """The machine part of a record: versions, GPUs with capabilities, macOS (data/hardware-runs/README.md)."""
    return MachineRecord(
        torch=hw.torch, cuda=hw.torch_cuda, driver=hardware.driver_version() if hw.cuda_devices else None,
        nccl=hw.nccl, cudnn=hw.cudnn, python=hw.python, platform=f"{hw.platform} {hw.machine}", macos=hw.macos,
        mps=hw.mps_available, nixl=hw.nixl, summary=hw.short(),
        gpus=tuple(GpuRecord(d.name, d.sm, round(d.memory_gib, 1)) for d in hw.cuda_devices),
    )


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def run_paths(paths: Sequence[GatedPath], hw: HardwareReport | None = None, *, echo: bool = True
              ) -> list[CheckRecord]:
    """Run (or skip) each path's check (`pt215.verify.checks`); one record per path (passed / failed / skipped)."""
    hw = hw or hardware.report()
    results = []
    path_checks.clear_shared()
    for p in paths:
        row: dict[str, Any] = {"id": p.id, "chapter": p.chapter, "title": p.title, "where": p.where,
                               "needs": p.needs, "mode": fake_cuda.MODE if p.fake else REAL}
        reason = hardware.unmet(*p.needs, hw=hw) if p.needs else None
        if reason is not None:
            results.append(CheckRecord(**row, status="skipped", reason=reason))
            continue
        clock = Stopwatch()
        try:
            out = getattr(path_checks, p.check_name)()
            row.update(status="passed", figures=_jsonable(out.figures), limit=out.limit)
        except CheckSkipped as e:
            row.update(status="skipped", reason=str(e) or "an optional package it needs is missing")
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the run goes on
            lines = traceback.format_exception_only(type(e), e)
            row.update(status="failed", reason="".join(lines).strip().splitlines()[0][:500])
            if echo:
                traceback.print_exc(file=sys.stderr)
        results.append(CheckRecord(**row, seconds=round(clock.seconds, 2)))
        if echo:
            print(f"  {p.id}: {results[-1].status}", file=sys.stderr, flush=True)
    return results


def status_text(row: CheckRecord) -> str:
    """`passed`, `passed (fake CUDA: ...)`, `skipped: reason` or `FAILED: reason`."""
    if row.status == "passed":
        return "passed" + (f" ({row.mode})" if not row.real else "")
    if row.status == "skipped":
        return f"skipped: {row.reason}"
    return f"FAILED: {row.reason}"


def format_table(rows: Sequence[CheckRecord]) -> str:
    """One line per path (id, chapter, status) and the counts."""
    width = max(len(r.id) for r in rows)
    lines = [f"{'path':<{width}}  ch  status", f"{'-' * width}  --  ------"]
    lines += [f"{r.id:<{width}}  {r.chapter:>2}  {status_text(r)}" for r in rows]
    counts = {s: sum(r.status == s for r in rows) for s in ("passed", "failed", "skipped")}
    lines.append(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return "\n".join(lines)


def run_boundary(echo: bool = True) -> BoundaryRecord:
    """The run to the hardware boundary of every launched command (`pt215.verify.boundary`), as a record entry."""
    from pt215.verify import boundary

    outcomes = boundary.run_all(timeout=90)
    failed = [o for o in outcomes if not o.ok]
    if echo:
        for o in failed:
            print(boundary.format_outcome(o))
        print(f"run to the boundary: {len(outcomes) - len(failed)} of {len(outcomes)} launched commands reach the "
              f"hardware boundary on CPU or finish; {len(failed)} fail before it")
    return BoundaryRecord(commands=len(outcomes), reached=sum(o.status == "boundary" for o in outcomes),
                          finished=sum(o.status == "finished" for o in outcomes),
                          failed=tuple(BoundaryFailure(o.command.where, o.command.shell(), o.detail) for o in failed))


def _select(only: str | None) -> list[GatedPath]:
    if only == "boundary":
        return []
    paths = [p for p in PATHS if only is None or only in p.id]
    if not paths:
        raise SystemExit(f"--only {only!r} matches no gated path; see --list")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m pt215.verify`; returns the exit code (1 if any check failed)."""
    p = argparse.ArgumentParser(prog="python -m pt215.verify", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="list every gated path with its chapter and needs")
    p.add_argument("--out", type=Path, help="write the JSON record of this run to this file")
    p.add_argument("--only", help="run only the paths whose id contains this text (e.g. ch5. or fake); "
                                  "'boundary': only the run to the hardware boundary")
    p.add_argument("--skip-boundary", action="store_true",
                   help="leave out the run of every launched command to its first hardware call")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    paths = _select(a.only)
    with_boundary = not a.skip_boundary and a.only in (None, "boundary")
    if a.list:
        width = max((len(x.id) for x in paths), default=0)
        for x in paths:
            needs = ", ".join(x.needs) or "nothing (fake CUDA)"
            print(f"{x.id:<{width}}  ch{x.chapter}  needs {needs:<20}  {x.title}")
        print(f"{len(paths)} gated paths")
        if with_boundary:
            from pt215.verify.boundary import commands

            print(f"and the run to the hardware boundary of {len(commands())} launched commands "
                  "(python -m pt215.verify.boundary --list)")
        return 0
    hw = hardware.report()
    print(f"pt215.verify on {hw.short()}, torch {hw.torch}", flush=True)
    started = _dt.datetime.now(_dt.UTC)
    clock = Stopwatch()
    rows = run_paths(paths, hw)
    if rows:
        print(format_table(rows))
    bound = run_boundary() if with_boundary else None
    if a.out is not None:
        record = RunRecord(
            date=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            command="python -m pt215.verify " + shlex.join(list(sys.argv[1:] if argv is None else argv)),
            seconds=round(clock.seconds, 1), machine=machine_record(hw), checks=tuple(rows), boundary=bound)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
        print(f"record written to {a.out.name}")
    failed = any(r.status == "failed" for r in rows) or bool(bound and bound.failed)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
