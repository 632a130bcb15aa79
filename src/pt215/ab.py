"""A/B runs of a torchrun job on your own cluster: two settings, interleaved, repeated, compared (chapter 11).

    python -m pt215.ab train.py --nproc 4 --reps 3 \\
        --a-env-from launch_old.sh --a-args "--backend nccl-legacy" \\
        --b-env-from launch_new.sh --b-args "--backend nccl" \\
        --metric 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+) step_ms (?P<step_ms>[\\d.]+)' -- --steps 20

Each arm is a setting of the same job: environment variables (given as `KEY=VALUE`, or read from the `export`
lines of a launch script), extra job arguments (a backend, a policy flag) and the world size. The runs alternate
A B B A A B ... (so a machine that warms up or slows down over time affects both arms alike), each through
`pt215.launch.run` with its timeout. From every run it takes the wall time and, from rank 0's output, every line
the `--metric` regular expression matches (its named groups are the metrics; several matching lines, one per
step, are pooled; a group that does not take part in a match is skipped, so one pattern with alternatives reads
several kinds of line). The table gives each metric's median and spread (min-max over all samples) per arm, and
B/A of the medians.

A run that fails is reported with its rank, exit code and last output line, and its arm is not averaged: the table
says which arm failed and the command exits 1. Arms of different world sizes are refused before anything runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pt215.launch import LaunchError, LaunchResult, LaunchTimeoutError, RankFailedError, run

__all__ = ["Arm", "Comparison", "RunOutcome", "compare", "env_from_script", "format_table", "main", "parse_arm",
           "run_arm"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class Arm:
    """One setting: a name, environment variables to add, extra job arguments, and the world size."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    nproc: int = 2


@dataclass
class RunOutcome:
    """One run of one arm: its wall time and metric samples, or why it failed."""

    arm: str
    rep: int
    wall_s: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Comparison:
    """Every run, in the order they ran, and the per-arm summary."""

    arms: tuple[Arm, Arm]
    runs: list[RunOutcome]

    def failed(self, arm: str) -> list[RunOutcome]:
        return [r for r in self.runs if r.arm == arm and r.error is not None]

    def pooled(self, arm: str) -> dict[str, list[float]]:
        """{metric: every sample of the arm's runs}; `wall_s` is one sample per run."""
        out: dict[str, list[float]] = {}
        for r in self.runs:
            if r.arm != arm or r.error is not None:
                continue
            out.setdefault("wall_s", []).append(float(r.wall_s or 0.0))
            for k, v in r.samples.items():
                out.setdefault(k, []).extend(v)
        return out

    def median(self, arm: str, metric: str) -> float:
        """The median of an arm's samples of `metric`; raises ValueError when the arm failed or has none."""
        if self.failed(arm):
            raise ValueError(f"median(): arm {arm} has failed runs; its values are not averaged")
        values = self.pooled(arm).get(metric)
        if not values:
            raise ValueError(f"median(): arm {arm} has no samples of {metric!r}")
        return statistics.median(values)

    def ratio(self, metric: str) -> float:
        """B/A of the medians of `metric`."""
        a, b = (arm.name for arm in self.arms)
        return self.median(b, metric) / self.median(a, metric)


def parse_arm(name: str, spec: str, nproc: int) -> Arm:
    """`"KEY=VALUE KEY2=VALUE2"` (space- or comma-separated) into an Arm; an empty spec is the job unchanged."""
    env: dict[str, str] = {}
    for part in re.split(r"[\s,]+", spec.strip()) if spec.strip() else []:
        key, sep, value = part.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ValueError(f"--{name.lower()}: {part!r} is not KEY=VALUE (an environment variable setting)")
        env[key] = value
    return Arm(name, env, (), nproc)


def env_from_script(path: str | os.PathLike) -> dict[str, str]:
    """The variables a launch script exports with a literal value (`export NAME=VALUE` lines, read as the shell
    reads one word: quotes removed, a trailing comment dropped).

    Values that the shell would compute (`$HOME/x`, `$(...)`, backquotes) are left out: they belong to the machine
    the script runs on, not to the setting an A/B compares."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"env_from_script(): no launch script {str(path)!r}")
    env: dict[str, str] = {}
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _EXPORT.match(line)
        if not m or any(c in m.group(2) for c in "$`"):
            continue
        try:
            words = shlex.split(m.group(2), comments=True)
        except ValueError:  # an unbalanced quote: not a value the shell would read either
            continue
        if len(words) <= 1:
            env[m.group(1)] = words[0] if words else ""
    return env


def run_arm(job: str | os.PathLike, arm: Arm, *, job_args: Sequence[str] = (), timeout: float = 300.0,
            cwd: str | os.PathLike | None = None, show: bool = False) -> LaunchResult:
    """One run of the job under one arm's setting (its environment, its arguments after `job_args`, its world
    size), through `pt215.launch.run`; raises what `run` raises when a rank fails or the run times out."""
    return run(job, arm.nproc, args=[*job_args, *arm.args], env=dict(arm.env), timeout=timeout, cwd=cwd,
               stream=False, show=show)


def _run_once(job: str | os.PathLike, arm: Arm, rep: int, job_args: Sequence[str], metric: re.Pattern[str] | None,
              timeout: float, cwd: str | os.PathLike | None) -> RunOutcome:
    out = RunOutcome(arm.name, rep)
    try:
        res = run_arm(job, arm, job_args=job_args, timeout=timeout, cwd=cwd)
    except RankFailedError as e:
        last = next((line for line in reversed(e.last_output) if line.strip()), "")
        out.error = f"rank {e.rank} exited with {e.exitcode}: {last.strip()[:160]}"
        return out
    except LaunchTimeoutError as e:
        out.error = f"did not finish within {e.timeout:g} s"
        return out
    except LaunchError as e:
        out.error = str(e).splitlines()[0][:200]
        return out
    out.wall_s = res.elapsed_s
    if metric is not None:
        for line in res.stdout.get(0, []):
            m = metric.search(line)
            if not m:
                continue
            for k, v in m.groupdict().items():
                try:
                    out.samples.setdefault(k, []).append(float(v))
                except (TypeError, ValueError):
                    pass
        if not out.samples:
            out.error = "rank 0 printed no line the --metric pattern matches"
    return out


def compare(job: str | os.PathLike, a: Arm, b: Arm, *, reps: int = 3, job_args: Sequence[str] = (),
            metric: str | None = None, timeout: float = 300.0, cwd: str | os.PathLike | None = None,
            echo: bool = False) -> Comparison:
    """Run arms `a` and `b` alternately (A B, B A, A B, ...), `reps` times each, and return every outcome."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"compare(): reps must be an int >= 1, got {reps!r}")
    for arm in (a, b):
        if isinstance(arm.nproc, bool) or not isinstance(arm.nproc, int) or arm.nproc < 1:
            raise ValueError(f"compare(): arm {arm.name} needs nproc >= 1 ranks, got {arm.nproc!r}")
    if a.nproc != b.nproc:
        raise ValueError(f"compare(): the arms have different world sizes ({a.name}: {a.nproc} ranks, {b.name}: "
                         f"{b.nproc} ranks): an A/B comparison needs the same job size in both arms")
    if a.name == b.name:
        raise ValueError(f"compare(): the two arms need different names, both are {a.name!r}")
    pattern = None
    if metric is not None:
        try:
            pattern = re.compile(metric)
        except re.error as e:
            raise ValueError(f"compare(): metric is not a regular expression: {e}") from None
        if not pattern.groupindex:
            raise ValueError("compare(): metric needs named groups, e.g. 'loss (?P<loss>[\\d.]+)'")
    runs = []
    for rep in range(reps):
        for arm in (a, b) if rep % 2 == 0 else (b, a):
            outcome = _run_once(job, arm, rep, job_args, pattern, timeout, cwd)
            if echo:
                print(f"  {arm.name} rep {rep + 1}: " + (f"FAILED: {outcome.error}" if outcome.error else
                                                        f"{outcome.wall_s:.1f} s"), flush=True)
            runs.append(outcome)
    return Comparison((a, b), runs)


def _cell(values: list[float], digits: int, mark: str = "") -> str:
    med = statistics.median(values)
    return f"{mark}{med:.{digits}f} ({mark}{min(values):.{digits}f}-{mark}{max(values):.{digits}f})"


def format_table(c: Comparison, digits: int | Mapping[str, int] = 3, mask: Sequence[str] = (),
                 approx: Sequence[str] = ()) -> str:
    """The comparison as a text table: median (min-max) per arm and B/A; failures listed below, never averaged.

    `digits` is the number of decimals, for every metric or per metric (`{"loss": 4, "bytes": 0}`, 3 for the rest).

    Metrics named in `mask` (timings, say, in a stored notebook output) show as `~`. Metrics named in `approx`
    (values whose last digits depend on the machine's kernels, such as a bf16 loss) get the book's `≈` mark on
    every number, so a stored output compares them through the sanitizer (chapter 0, "Outputs that hold on any
    CPU") while the notebook checks them against a tolerance.
    """
    a, b = (arm.name for arm in c.arms)
    pa, pb = c.pooled(a), c.pooled(b)
    places = dict(digits) if isinstance(digits, Mapping) else {}
    default = 3 if isinstance(digits, Mapping) else digits
    if isinstance(default, bool) or not isinstance(default, int) or default < 0 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in places.values()):
        raise ValueError(f"format_table(): digits must be an int >= 0 or a mapping of metric names to ints >= 0, "
                         f"got {digits!r}")
    width = 28
    for metric in set(pa) | set(pb):
        for v in pa.get(metric, []) + pb.get(metric, []):
            d = places.get(metric, default)
            width = max(width, len(_cell([v], d, "≈" if metric in approx else "")))
    lines = [f"{'metric':<14} {a + ' median (min-max)':>{width}} {b + ' median (min-max)':>{width}} {'B/A':>8}"]
    for metric in sorted(set(pa) | set(pb), key=lambda m: (m != "wall_s", m)):
        va, vb = pa.get(metric, []), pb.get(metric, [])
        if metric in mask:
            lines.append(f"{metric:<14} {'~':>{width}} {'~':>{width}} {'~':>8}")
            continue
        mark, d = "≈" if metric in approx else "", places.get(metric, default)
        ca = _cell(va, d, mark) if va and not c.failed(a) else "n/a"
        cb = _cell(vb, d, mark) if vb and not c.failed(b) else "n/a"
        ratio = (f"{mark}{statistics.median(vb) / statistics.median(va):.3f}" if va and vb and statistics.median(va)
                 and not c.failed(a) and not c.failed(b) else "n/a")
        lines.append(f"{metric:<14} {ca:>{width}} {cb:>{width}} {ratio:>8}")
    n = {arm: sum(r.arm == arm for r in c.runs) for arm in (a, b)}
    lines.append(f"runs: {a} {n[a]}, {b} {n[b]}, interleaved ({' '.join(r.arm for r in c.runs)})")
    for r in c.runs:
        if r.error is not None:
            lines.append(f"FAILED: arm {r.arm}, rep {r.rep + 1}: {r.error} (arm {r.arm} not averaged)")
    return "\n".join(lines)


def _arm(name: str, spec: str, env_from: str | None, args: str, nproc: int) -> Arm:
    arm = parse_arm(name, spec, nproc)
    env = {**(env_from_script(env_from) if env_from else {}), **arm.env}
    try:
        extra = tuple(shlex.split(args))
    except ValueError as e:
        raise ValueError(f"--{name.lower()}-args: {e}") from None
    return Arm(name, env, extra, nproc)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; exit 0 when every run of both arms succeeded, 1 when one failed, 2 on bad input."""
    p = argparse.ArgumentParser(prog="python -m pt215.ab", description=__doc__.split("\n")[0])
    p.add_argument("job", help="the torchrun script to run (the same in both arms)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per run (both arms; default 2)")
    p.add_argument("--b-nproc", type=int, default=None, help="ranks for arm B, if different (refused)")
    p.add_argument("--reps", type=int, default=3, help="runs per arm (default 3)")
    p.add_argument("--a", default="", metavar="ENV", help='arm A\'s environment, "KEY=VALUE ..." (default: none)')
    p.add_argument("--b", default="", metavar="ENV", help='arm B\'s environment, "KEY=VALUE ..."')
    p.add_argument("--a-env-from", metavar="SCRIPT", help="arm A also gets the variables this launch script exports")
    p.add_argument("--b-env-from", metavar="SCRIPT", help="arm B also gets the variables this launch script exports")
    p.add_argument("--a-args", default="", help="extra job arguments for arm A only (one string, shell-quoted)")
    p.add_argument("--b-args", default="", help="extra job arguments for arm B only (one string, shell-quoted)")
    p.add_argument("--metric", help="regular expression with named groups, matched against rank 0's output")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is killed (default 300)")
    p.epilog = "Arguments after -- go to the job, in both arms."
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ns, job_args = p.parse_args(argv[:cut]), argv[cut + 1:]
    try:
        a = _arm("A", ns.a, ns.a_env_from, ns.a_args, ns.nproc)
        b = _arm("B", ns.b, ns.b_env_from, ns.b_args, ns.b_nproc if ns.b_nproc is not None else ns.nproc)
        c = compare(ns.job, a, b, reps=ns.reps, job_args=job_args, metric=ns.metric, timeout=ns.timeout,
                    echo=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"pt215.ab: error: {e}", file=sys.stderr)
        return 2
    print(format_table(c))
    return 1 if any(r.error for r in c.runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
