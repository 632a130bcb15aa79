"""Run a standalone torchrun-compatible script on N local ranks from a notebook cell.

Used by every chapter with a multi-rank demo (chapters 1-4). The script is launched through torch's own
launcher (`python -m torch.distributed.run --standalone`), so it behaves exactly as under `torchrun`.

    res = run("collectives.py", nproc=4, timeout=60)
    res.results[0]          # what rank 0 passed to report(...)

Guarantees: a hard timeout; per-rank output streamed live and then printed grouped by rank (stable for
nbval); a failing rank raises `RankFailedError` naming the rank and its last output; every process the
launch started is gone afterwards, on success, failure, hang, timeout or interrupt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "LaunchError",
    "LaunchResult",
    "LaunchTimeoutError",
    "Rank",
    "RankFailedError",
    "init_rank",
    "report",
    "run",
    "running_processes",
    "shutdown",
]

RESULT_DIR_ENV = "PT215_RESULT_DIR"
_TAIL = 15  # lines of a rank's output quoted in errors


class LaunchError(RuntimeError):
    """Base class of the launcher's errors."""


class RankFailedError(LaunchError):
    """A rank exited with a non-zero code. `rank`, `exitcode` and `last_output` say which and why."""

    def __init__(self, script: str, rank: int, exitcode: int | None, last_output: list[str]):
        self.script, self.rank, self.exitcode, self.last_output = script, rank, exitcode, last_output
        code = "unknown" if exitcode is None else str(exitcode)
        tail = "\n".join(f"    {line}" for line in last_output) or "    (no output)"
        super().__init__(f"rank {rank} of {script} failed (exit code {code}); its last output:\n{tail}")


class LaunchTimeoutError(LaunchError):
    """The launch did not finish within its timeout; every process was killed."""

    def __init__(self, script: str, timeout: float, killed: int, last_output: dict[int, list[str]]):
        self.script, self.timeout, self.killed, self.last_output = script, timeout, killed, last_output
        lines = []
        for rank in sorted(last_output):
            tail = last_output[rank][-3:]
            lines.append(f"  rank {rank}: " + (" | ".join(tail) if tail else "(no output)"))
        super().__init__(
            f"{script} did not finish within {timeout:g} s; killed {killed} process(es). "
            "Last output per rank:\n" + "\n".join(lines)
        )


@dataclass
class LaunchResult:
    """What a successful launch returns: per-rank stdout/stderr lines and reported results."""

    script: str
    nproc: int
    returncode: int
    elapsed_s: float
    stdout: dict[int, list[str]] = field(default_factory=dict)
    stderr: dict[int, list[str]] = field(default_factory=dict)
    results: dict[int, Any] = field(default_factory=dict)
    launcher_output: str = ""

    def __repr__(self) -> str:  # short and stable: shown when a cell ends with `res`
        return (f"LaunchResult(script={self.script!r}, nproc={self.nproc}, returncode={self.returncode}, "
                f"ranks_reported={sorted(self.results)})")


def report(obj: Any) -> Any:
    """Called inside a launched script: hand a JSON-serialisable result for this rank back to `run`.

    Outside `pt215.launch.run` (a plain `torchrun`), it does nothing and returns `obj`.
    """
    folder = os.environ.get(RESULT_DIR_ENV)
    if not folder:
        return obj
    rank = int(os.environ.get("RANK", "0"))
    text = json.dumps(obj)
    tmp = Path(folder) / f".rank{rank}.json.tmp"
    tmp.write_text(text)
    os.replace(tmp, Path(folder) / f"rank{rank}.json")
    return obj


def shutdown(timeout_s: float = 60.0) -> None:
    """End a rank's distributed work cleanly; every multi-rank chapter script ends with it.

    A rank that tears gloo down while a peer is still finishing its last collective can make that peer abort
    (SIGABRT, "terminate called without an active exception"). So: a barrier on the default group, then every
    rank confirms through the rendezvous store that it has left that barrier, and only then are all process
    groups destroyed. Does nothing when no process group is initialised.
    """
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pt215/shutdown/{rank}", "1")
    store.wait([f"pt215/shutdown/{r}" for r in range(world)], datetime.timedelta(seconds=timeout_s))
    dist.destroy_process_group()


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the job: what `init_rank` returns."""

    rank: int
    world: int
    local_rank: int
    device: Any  # torch.device; typed loosely so that importing pt215.launch does not import torch


def init_rank(backend: str = "gloo", *, timeout_s: float | None = None, bind_device: bool = True,
              **init_kwargs: Any) -> Rank:
    """Join the job torchrun started, the one preamble of every chapter script; end it with `shutdown()`.

    Backends whose name contains "nccl" get device `cuda:LOCAL_RANK`, made current and passed as
    `device_id` (eager communicator creation) unless `bind_device=False`; other backends get the CPU.
    `timeout_s` turns a hang into an error. Without torchrun's environment (no `RANK`) it forms a 1-rank
    group over a `HashStore`, so a script's `main()` also runs in a plain process. `init_kwargs` go to
    `init_process_group` (e.g. `enable_reconfigure=True`).
    """
    import datetime

    import torch
    import torch.distributed as dist

    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a backend name such as 'gloo' or 'nccl', got {backend!r}")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
                                  or timeout_s <= 0):
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if "nccl" in backend:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    kwargs = dict(init_kwargs)
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda" and bind_device:
        kwargs["device_id"] = device
    if "RANK" not in os.environ and "store" not in kwargs:
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group(backend, **kwargs)
    return Rank(dist.get_rank(), dist.get_world_size(), local_rank, device)


# ---------------------------------------------------------------- process bookkeeping


def _descendants(pid: int) -> set[int]:
    """PIDs of every live process below `pid` (psutil, so it works on Linux and macOS)."""
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def running_processes(marker: str) -> int:
    """How many live processes have `marker` in their command line (chapter 0 uses it to show no orphans)."""
    n = 0
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                n += 1
        except psutil.Error:
            continue
    return n


def _kill_all(root: subprocess.Popen, known: set[int]) -> int:
    """Terminate the launcher and every process it started; return how many were alive."""
    pids = set(known) | _descendants(root.pid) | {root.pid}
    alive = {p for p in pids if _alive(p)}
    if not alive:
        return 0
    first = len(alive)
    # Windows has no SIGKILL (os.kill with SIGTERM ends a process there); WSL2 is Linux and has both.
    for sig, grace in ((signal.SIGTERM, 3.0), (getattr(signal, "SIGKILL", signal.SIGTERM), 5.0)):
        pids |= _descendants(root.pid)
        alive = {p for p in pids if _alive(p)}
        for p in alive:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                root.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if not any(_alive(p) for p in alive):
                break
    if root.poll() is None:
        root.kill()
        root.wait()
    return first


# ---------------------------------------------------------------- output tailing


class _Tailer:
    """Follows the per-rank log files torch's launcher writes (`--redirects 3 --log-dir`)."""

    def __init__(self, log_dir: Path, nproc: int, on_line):
        self.log_dir, self.nproc, self.on_line = log_dir, nproc, on_line
        self.lines: dict[str, dict[int, list[str]]] = {"stdout": {}, "stderr": {}}
        self._pos: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}

    def poll(self, final: bool = False) -> None:
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            rank, stream = int(path.parent.name), path.stem
            try:
                with open(path, "rb") as f:
                    f.seek(self._pos.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self._pos[path] = self._pos.get(path, 0) + len(data)
            text = self._partial.pop(path, "") + data.decode(errors="replace")
            parts = text.split("\n")
            if not final:
                rest = parts.pop()
                if rest:
                    self._partial[path] = rest
            elif parts and parts[-1] == "":
                parts.pop()
            for line in parts:
                line = line.rstrip("\r")
                self.lines[stream].setdefault(rank, []).append(line)
                self.on_line(rank, stream, line)


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and hasattr(ip, "kernel")


class _LiveView:
    """Live per-rank output: printed as it comes in a terminal; in a notebook shown in a display area that
    is emptied at the end (so the cell's stored output is only the grouped, ordered text)."""

    def __init__(self, enabled: bool, max_lines: int = 40):
        self.enabled, self.max_lines = enabled, max_lines
        self.notebook = _in_notebook()  # the status line shows in a notebook even when rank output does not
        self.recent: list[str] = []
        self.handle = None
        self._last = 0.0
        if self.notebook:
            from IPython.display import Pretty, display

            self.handle = display(Pretty(""), display_id=True)

    def line(self, rank: int, stream: str, text: str) -> None:
        if not self.enabled or stream != "stdout":
            return
        if not self.notebook:
            print(f"[rank{rank}] {text}", flush=True)
            return
        self.recent = (self.recent + [f"[rank{rank}] {text}"])[-self.max_lines :]
        now = time.monotonic()
        if now - self._last > 0.3 and self.handle is not None:
            from IPython.display import Pretty

            self.handle.update(Pretty("\n".join(self.recent)))
            self._last = now

    def tick(self, script: str, nproc: int, elapsed: float, timeout: float) -> None:
        """In a notebook, a status line under the live output every 2 s, so a long or silent launch (a rank
        waiting in a collective prints nothing) never looks like a hang; emptied at the end like the rest."""
        if self.handle is None or time.monotonic() - self._last < 2.0:
            return
        from IPython.display import Pretty

        status = f"[{script}: {nproc} rank(s) running for {elapsed:.0f} s, at most {timeout:g} s]"
        self.handle.update(Pretty("\n".join([*self.recent, status])))
        self._last = time.monotonic()

    def close(self) -> None:
        if self.handle is not None:
            from IPython.display import Pretty

            self.handle.update(Pretty(""))


# ---------------------------------------------------------------- the launcher

_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _check_args(script: str | os.PathLike, nproc: int, timeout: float, args: Sequence[str],
                cwd: str | os.PathLike | None) -> Path:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"run(): nproc must be a positive int (number of local ranks), got {nproc!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"run(): timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"run(): args must be a list of strings, got {args!r}")
    base = Path(cwd) if cwd is not None else Path.cwd()
    path = Path(script)
    path = path if path.is_absolute() else base / path
    if path.is_file():
        return path
    if not Path(script).is_absolute() and str(script).endswith(".py"):
        # A notebook opened on its own (a download, Colab): the chapter scripts ship with pt215.
        from pt215.book_files import BookFilesError, chapter_script

        try:
            return chapter_script(Path(script).as_posix())
        except BookFilesError as e:
            raise FileNotFoundError(f"run(): script {str(script)!r} not found in the folder {base.name!r}, "
                                    f"nor among the book's chapter scripts ({e})") from None
    raise FileNotFoundError(f"run(): script {str(script)!r} not found (looked in the folder {base.name!r})")


def _attempt(path: Path, nproc: int, args: Sequence[str], timeout: float, env: Mapping[str, str] | None,
             workdir: Path, view: _LiveView) -> tuple[LaunchResult, LaunchError | None]:
    """One launch: the result (per-rank output, reports) and the error it ended with, if any."""
    tmp = Path(tempfile.mkdtemp(prefix="pt215-launch-"))
    results_dir, log_dir = tmp / "results", tmp / "logs"
    results_dir.mkdir()
    log_dir.mkdir()
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env.update({"PYTHONUNBUFFERED": "1", RESULT_DIR_ENV: str(results_dir)})
    if env:
        child_env.update({str(k): str(v) for k, v in env.items()})
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
        "--redirects=3", f"--log-dir={log_dir}",
        str(path), *args,
    ]
    tailer = _Tailer(log_dir, nproc, view.line)
    launcher_out: list[bytes] = []
    known: set[int] = set()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    reader = threading.Thread(target=lambda: launcher_out.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    timed_out = False
    try:
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                timed_out = True
                break
            known |= _descendants(proc.pid)
            tailer.poll()
            view.tick(path.name, nproc, time.monotonic() - start, timeout)
            time.sleep(0.1)
    finally:
        # Runs on success, failure, timeout and KeyboardInterrupt alike.
        killed = _kill_all(proc, known)
        reader.join(timeout=5)
        tailer.poll(final=True)
    launcher_text = b"".join(launcher_out).decode(errors="replace")
    stdout, stderr = tailer.lines["stdout"], tailer.lines["stderr"]
    results = {int(f.stem[4:]): json.loads(f.read_text()) for f in sorted(results_dir.glob("rank*.json"))}
    shutil.rmtree(tmp, ignore_errors=True)
    res = LaunchResult(path.name, nproc, proc.returncode, time.monotonic() - start, stdout, stderr, results,
                       launcher_text)
    if timed_out:
        merged = {r: stdout.get(r, []) + stderr.get(r, []) for r in range(nproc)}
        return res, LaunchTimeoutError(path.name, timeout, killed, merged)
    if proc.returncode != 0:
        m = _ROOT_CAUSE.search(launcher_text)
        if m:
            rank, code = int(m.group(1)), int(m.group(2))
        else:  # the launcher itself failed (bad arguments, rendezvous): report rank 0's view
            rank, code = 0, proc.returncode
        last = (stdout.get(rank, []) + stderr.get(rank, []))[-_TAIL:]
        if not last:
            last = launcher_text.strip().splitlines()[-_TAIL:]
        return res, RankFailedError(path.name, rank, code, last)
    return res, None


def run(
    script: str | os.PathLike,
    nproc: int = 2,
    *,
    args: Sequence[str] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stream: bool = True,
    show: bool = True,
    retries: int = 0,
) -> LaunchResult:
    """Launch `script` on `nproc` local ranks through torch's launcher and wait at most `timeout` seconds.

    `args` are passed to the script; `env` entries are added to the environment. With `stream`, output is
    shown live; with `show`, each rank's stdout is printed afterwards, grouped and prefixed `[rankN]` (from the
    last attempt only). `retries` re-launches after a failed rank (not after a timeout), for known-flaky
    teardowns such as gloo's occasional abort at exit (chapter 4). Returns a `LaunchResult`; raises
    `RankFailedError` or `LaunchTimeoutError`.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"run(): retries must be an int >= 0, got {retries!r}")
    path = _check_args(script, nproc, timeout, args, cwd)
    workdir = Path(cwd) if cwd is not None else Path.cwd()
    view = _LiveView(stream)
    try:
        for attempt in range(retries + 1):
            res, err = _attempt(path, nproc, args, timeout, env, workdir, view)
            if not isinstance(err, RankFailedError) or attempt == retries:
                break
    finally:
        view.close()
    if show and (view.notebook or not stream):  # a terminal already saw the lines live
        for rank in sorted(res.stdout):
            for line in res.stdout[rank]:
                print(f"[rank{rank}] {line}")
    if err is not None:
        raise err
    return res


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pt215.launch SCRIPT -n N [--timeout S] [-- script args]`: prints each rank's report as JSON."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after `--` goes to the script; options may stand before or after SCRIPT
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(prog="python -m pt215.launch", description=main.__doc__,
                                epilog="Arguments after `--` are passed to the script.")
    p.add_argument("script")
    p.add_argument("-n", "--nproc", type=int, default=2, help="number of local ranks (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before every rank is killed (default 60)")
    a = p.parse_args(argv)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # live per-rank lines on stderr; stdout stays pure JSON
            res = run(a.script, a.nproc, args=extra, timeout=a.timeout, show=False)
    except LaunchError as e:
        print(e, file=sys.stderr)
        return 1
    print(json.dumps({str(k): v for k, v in res.results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
