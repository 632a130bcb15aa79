"""Run every command a notebook launches, on CPU, up to the first hardware call (all chapters; `pt215.verify`).

    python -m pt215.verify.boundary            # one line per launched command: where it stopped, or why it failed
    python -m pt215.verify.boundary --list     # the commands, as derived from the notebooks' code cells

The commands are read from the notebooks' sources (`chapters/*/[0-9]*.md`, their code cells): every
`pt215.launch.run("X.py", nproc, args=[...], env={...})` call, with the values its cell gives the arguments
(literals, loop variables, a helper's call sites, temporary folders). Each command then runs as rank 0 of its
job in a child process: the script's argument checks and set-up run for real; the first call that needs the
hardware or the other ranks (`init_process_group`, a `TCPStore`, any CUDA, MPS or NCCL query) raises
`HardwareBoundary` there instead, and the command counts as having reached the boundary. A command that exits
or raises before it (argparse's exit code 2, a `ValueError`) is reported with its message.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Command", "HardwareBoundary", "Outcome", "commands", "extract", "main", "run_all", "run_one"]

ROOT = Path(__file__).resolve().parents[3]
CHAPTERS = ROOT / "chapters"
ASSUMED_GPUS = 2  # a rank count the notebook takes from the machine (`torch.cuda.device_count()`)


class HardwareBoundary(BaseException):  # noqa: N818 - not an error: the point where the CPU run stops
    """Raised in the child at the first hardware call; a BaseException so a script's `except Exception` passes it."""


@dataclass(frozen=True)
class Command:
    """One launched command: which notebook cell launches which script with which arguments."""

    notebook: str                      # relative to the repository root
    line: int                          # line of the `run(` call in the notebook source
    script: str
    nproc: int
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        return f"{self.notebook}:{self.line}"

    def shell(self) -> str:
        """The command as torchrun would take it (temporary folders shown as `<tmp>`)."""
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cmd = f"torchrun --nproc-per-node {self.nproc} {self.script} {shlex.join(self.args)}".rstrip()
        return f"{envs} {cmd}".strip().replace("'{tmp}", "'<tmp>").replace("{tmp}", "<tmp>")


@dataclass
class Outcome:
    """How one command ended on CPU: `boundary` (reached it), `finished` (no hardware call) or `failed`."""

    command: Command
    status: str
    detail: str
    seconds: float = 0.0
    output: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("boundary", "finished")


# ------------------------------------------------------------------------------------ reading the notebooks

_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def code_cells(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, code) of each code cell of a MyST notebook source, its option header removed."""
    for m in _CELL.finditer(text):
        body, line = m.group(1), text.count("\n", 0, m.start(1)) + 1
        if body.startswith("---\n"):
            end = body.find("\n---\n", 3)
            if end >= 0:
                line += body.count("\n", 0, end + 5)
                body = body[end + 5:]
        lines = body.split("\n")
        while lines and lines[0].startswith(":"):  # short-form cell options (`:tags: [...]`)
            lines[0] = ""
        # IPython magics and shell escapes are not Python: blank them, keeping the line numbers
        yield line, "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)


class Unresolved(Exception):  # noqa: N818
    """A value the notebook computes at run time that the source alone does not give."""


@dataclass(frozen=True)
class _Tmp:
    """A temporary folder of the notebook (`tempfile.mkdtemp()`, `Path(...) / "x"`): a fresh one per command."""

    parts: tuple[str, ...] = ()

    def __truediv__(self, other: object) -> _Tmp:
        return _Tmp((*self.parts, str(other)))


class _Evaluator:
    """Evaluates a cell's argument expressions from literals, loop variables, call sites and assignments."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.assigned: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(node.value)
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                self.assigned.setdefault(node.optional_vars.id, []).append(node.context_expr)
        self._busy: set[str] = set()

    # the environments (name -> value) a call runs under: one per loop iteration / helper call site
    def environments(self, node: ast.AST) -> list[dict[str, Any]]:
        envs: list[dict[str, Any]] = [{}]
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, ast.For) and child is not parent.iter:
                try:
                    values = list(self.value(parent.iter, {}))
                except (Unresolved, TypeError):
                    values = None
                if values is not None:
                    envs = [e | b for e in envs for v in values for b in [self._bind(parent.target, v)]]
            elif isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
                envs = [e | b for e in envs for b in self._call_sites(parent)]
            child, parent = parent, self.parents.get(parent)
        return envs

    def _bind(self, target: ast.AST, value: Any) -> dict[str, Any]:
        if isinstance(target, ast.Name):
            return {target.id: value}
        if isinstance(target, ast.Tuple | ast.List):
            out: dict[str, Any] = {}
            for t, v in zip(target.elts, value, strict=True):
                out |= self._bind(t, v)
            return out
        raise Unresolved(ast.unparse(target))

    def _call_sites(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[dict[str, Any]]:
        a = fn.args
        names = [p.arg for p in a.args]
        defaults = dict(zip(names[len(names) - len(a.defaults):], a.defaults, strict=True))
        sites = []
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == fn.name):
                continue
            bound: dict[str, Any] = {}
            for name, expr in zip(names, node.args, strict=False):
                bound[name] = self._try(expr)
            if a.vararg is not None:
                bound[a.vararg.arg] = [self._try(e) for e in node.args[len(names):]]
            for kw in node.keywords:
                if kw.arg is not None:
                    bound[kw.arg] = self._try(kw.value)
            for name, expr in defaults.items():
                bound.setdefault(name, self._try(expr))
            sites.append(bound)
        return sites or [{}]

    def _try(self, expr: ast.AST) -> Any:
        try:
            return self.value(expr, {})
        except Unresolved as e:
            return e

    def value(self, node: ast.AST, env: dict[str, Any]) -> Any:  # noqa: C901, PLR0911, PLR0912 - one case per node
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            out: list[Any] = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    out.extend(self.value(e.value, env))
                else:
                    out.append(self.value(e, env))
            return out
        if isinstance(node, ast.Dict):
            return {self.value(k, env): self.value(v, env) for k, v in zip(node.keys, node.values, strict=True)
                    if k is not None}
        if isinstance(node, ast.Name):
            if node.id in env:
                v = env[node.id]
                if isinstance(v, Unresolved):
                    raise v
                return v
            return self._assigned(node.id, env)
        if isinstance(node, ast.IfExp):
            return self.value(node.body if self.value(node.test, env) else node.orelse, env)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq | ast.NotEq):
            same = self.value(node.left, env) == self.value(node.comparators[0], env)
            return same if isinstance(node.ops[0], ast.Eq) else not same
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = self.value(node.left, env)
            if isinstance(left, _Tmp):
                return left / self.value(node.right, env)
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.value(v.value if isinstance(v, ast.FormattedValue) else v, env))
                           for v in node.values)
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("str", "os.fspath") and len(node.args) == 1:
                return self.value(node.args[0], env)
            if name in ("Path", "pathlib.Path") and len(node.args) == 1:
                v = self.value(node.args[0], env)
                return v if isinstance(v, _Tmp) else str(v)
            if name in ("tempfile.mkdtemp", "mkdtemp", "tempfile.TemporaryDirectory", "TemporaryDirectory"):
                return _Tmp()
            if name in ("chapter_script", "book_files.chapter_script") and node.args:
                return self.value(node.args[0], env)
        raise Unresolved(ast.unparse(node))

    def _assigned(self, name: str, env: dict[str, Any]) -> Any:
        exprs = self.assigned.get(name)
        if not exprs or name in self._busy:
            raise Unresolved(name)
        self._busy.add(name)
        try:
            values = []
            for expr in exprs:
                try:
                    values.append(self.value(expr, env))
                except Unresolved:
                    continue
            if not values or any(v != values[0] for v in values[1:]):
                raise Unresolved(name)
            return values[0]
        finally:
            self._busy.discard(name)


def _launch_names(tree: ast.Module) -> set[str]:
    """The local names of `pt215.launch.run` in a notebook (`from pt215.launch import run [as x]`)."""
    names = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "pt215.launch" for a in node.names if a.name == "run"}
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return names - defined


def _is_launch(call: ast.Call, names: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in names
    return isinstance(f, ast.Attribute) and f.attr == "run" and ast.unparse(f.value) in ("launch", "pt215.launch")


def extract(text: str, notebook: str) -> list[Command]:
    """Every launched command of one notebook source (MyST markdown); raises `ValueError` naming a call whose
    script or arguments its cells do not give."""
    cells = list(code_cells(text))
    tree = ast.Module(body=[], type_ignores=[])
    offsets = []
    for line, code in cells:
        try:
            body = ast.parse(code).body
        except SyntaxError as e:
            raise ValueError(f"{notebook}:{line + (e.lineno or 1) - 1}: code cell does not parse: {e.msg}") from None
        for stmt in body:
            for node in ast.walk(stmt):
                if hasattr(node, "lineno"):
                    node.lineno += line - 1  # type: ignore[attr-defined]
        tree.body.extend(body)
        offsets.append(line)
    ev = _Evaluator(tree)
    names = _launch_names(tree)
    out: list[Command] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_launch(node, names) and node.args):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        for env in ev.environments(node):
            try:
                script = ev.value(node.args[0], env)
                args = ev.value(kw["args"], env) if "args" in kw else []
            except Unresolved as e:
                raise ValueError(f"{notebook}:{node.lineno}: cannot derive the launched command from the cell "
                                 f"(run-time value {e}); give it as a literal, a loop over literals or a "
                                 "helper's argument") from None
            if not isinstance(script, str) or not script.endswith(".py"):
                raise ValueError(f"{notebook}:{node.lineno}: launched script must be a literal '*.py', got "
                                 f"{ast.unparse(node.args[0])}")
            try:  # the environment only adds variables: one computed at run time is left out
                environ = ev.value(kw["env"], env) if "env" in kw else {}
            except Unresolved:
                environ = {}
            nexpr = node.args[1] if len(node.args) > 1 else kw.get("nproc")
            try:
                nproc = ev.value(nexpr, env) if nexpr is not None else 2
            except Unresolved:
                nproc = ASSUMED_GPUS
            out.append(Command(notebook, node.lineno, script, int(nproc), tuple(_text(a) for a in args),
                               tuple(sorted((str(k), _text(v)) for k, v in environ.items()))))
    return sorted(dict.fromkeys(out), key=lambda c: c.line)


def _text(v: Any) -> str:
    if isinstance(v, _Tmp):
        return "/".join(("{tmp}", *v.parts))
    return str(v)


def commands(root: Path = ROOT) -> list[Command]:
    """Every launched command of every notebook of the book, in chapter order."""
    out: list[Command] = []
    for md in sorted((root / "chapters").glob("*/[0-9]*.md")):
        out += extract(md.read_text(), md.relative_to(root).as_posix())
    return out


def script_path(cmd: Command, root: Path = ROOT) -> Path:
    path = (root / cmd.notebook).parent / cmd.script
    if not path.is_file():
        raise FileNotFoundError(f"{cmd.where}: launched script {cmd.script!r} not found next to the notebook")
    return path


# ------------------------------------------------------------------------------------ the child process

_CUDA_CALLS = ("_lazy_init", "init", "is_available", "device_count", "set_device", "current_device",
               "get_device_capability", "get_device_properties", "get_device_name", "synchronize", "mem_get_info",
               "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "empty_cache")


def _stop(what: str, original: Callable[..., Any] | None = None) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise HardwareBoundary(what)
    if original is not None:  # keep the name and `__wrapped__` torch itself reads (torch._dynamo)
        functools.update_wrapper(call, original)
    return call


def _patch(owner: Any, name: str, what: str) -> None:
    """Replace the function `owner.name` (classes are left: creating one initialises the device anyway)."""
    original = getattr(owner, name, None)
    if original is not None and not isinstance(original, type):
        setattr(owner, name, _stop(what, original))


def install_boundary() -> None:
    """In the child only: make every hardware or multi-rank entry point raise `HardwareBoundary`."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for mod in (dist, c10d):
        _patch(mod, "init_process_group", "init_process_group")
        mod.TCPStore = _stop("TCPStore")  # type: ignore[assignment, misc]  (a class: its constructor connects)
    try:
        import torch.distributed.device_mesh as dm

        _patch(dm, "init_device_mesh", "init_device_mesh")
        dist.init_device_mesh = dm.init_device_mesh  # type: ignore[attr-defined]
    except ImportError:
        pass
    for name in _CUDA_CALLS:
        _patch(torch.cuda, name, f"torch.cuda.{name}")
    _patch(torch.cuda.nccl, "version", "torch.cuda.nccl.version")
    _patch(torch.backends.mps, "is_available", "torch.backends.mps.is_available")
    for name in ("synchronize", "current_allocated_memory", "empty_cache"):
        _patch(torch.mps, name, f"torch.mps.{name}")
    for name in ("is_available", "device_count", "current_accelerator", "synchronize", "set_device_index"):
        _patch(torch.accelerator, name, f"torch.accelerator.{name}")


def _child(cmd: Command, script: Path, workdir: str, report: str) -> None:
    """Body of the child process: rank 0's environment, the boundary, the script's main(argv)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": str(cmd.nproc),
           "LOCAL_WORLD_SIZE": str(cmd.nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "pt215-boundary", "OMP_NUM_THREADS": "1"}
    os.environ.update(env | {k: v.replace("{tmp}", workdir) for k, v in cmd.env})
    os.environ.pop("PT215_RESULT_DIR", None)
    os.chdir(workdir)
    sys.path.insert(0, str(script.parent))
    sys.argv = [str(script), *cmd.args]
    result: dict[str, Any]
    try:
        install_boundary()
        import runpy

        module = runpy.run_path(str(script), run_name="__pt215_boundary__")
        code = module["main"]([a.replace("{tmp}", workdir) for a in cmd.args])
        result = {"status": "finished" if code in (0, None) else "failed",
                  "detail": "main() returned without a hardware call" if code in (0, None)
                  else f"main() returned {code}"}
    except HardwareBoundary as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(script)]
        at = f" at {script.name}:{frames[-1].lineno}" if frames else ""
        result = {"status": "boundary", "detail": f"{e.args[0]}{at}"}
    except SystemExit as e:
        ok = e.code in (0, None)
        result = {"status": "finished" if ok else "failed",
                  "detail": "exited 0 before any hardware call" if ok else f"exited with code {e.code}"}
    except BaseException as e:  # noqa: BLE001 - whatever stops the script before the boundary is the finding
        traceback.print_exc()
        result = {"status": "failed", "detail": "".join(traceback.format_exception_only(type(e), e)).strip()[:500]}
    Path(report).write_text(json.dumps(result))


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def _spawn(cmd: Command, script: Path, workdir: str, report: str, log: str) -> int:
    """Start the child: a fork of this process where available (torch already imported), else a new Python."""
    if sys.platform == "linux":
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 0
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                # the caller's sys.stdout/stderr may be objects of its own (pytest's capture): write to the log
                sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _child(cmd, script, workdir, report)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        return pid
    import subprocess

    payload = json.dumps({"cmd": cmd.__dict__, "script": str(script), "workdir": workdir, "report": report})
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "pt215.verify.boundary", "--child", payload], stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _POPEN[proc.pid] = proc  # polled (and so reaped) by _wait
    return proc.pid


_POPEN: dict[int, Any] = {}


def _wait(pid: int, timeout: float) -> bool:
    """Wait for the child `pid` at most `timeout` seconds; True if it ended."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = _POPEN.get(pid)
        if proc is not None:
            if proc.poll() is not None:
                del _POPEN[pid]
                return True
        else:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    return True
            except ChildProcessError:
                return not psutil.pid_exists(pid)
        time.sleep(0.02)
    return False


def run_one(cmd: Command, timeout: float = 60.0, root: Path = ROOT) -> Outcome:
    """Run one command as rank 0 up to the hardware boundary; the child is killed by PID after `timeout`."""
    from pt215.timing import Stopwatch

    clock = Stopwatch()
    try:
        script = script_path(cmd, root)
    except FileNotFoundError as e:
        return Outcome(cmd, "failed", str(e))
    with tempfile.TemporaryDirectory(prefix="pt215-boundary-") as tmp:
        report, log, work = os.path.join(tmp, "report.json"), os.path.join(tmp, "log.txt"), os.path.join(tmp, "w")
        os.mkdir(work)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _spawn(cmd, script, work, report, log)
        ended = _wait(pid, timeout)
        if not ended:
            _kill_tree(pid)
            _wait(pid, 5)
        output = Path(log).read_text(errors="replace").replace(work, "<tmp>").splitlines() if os.path.exists(log) \
            else []
        if not ended:
            return Outcome(cmd, "failed", f"no hardware call within {timeout:g} s (killed)", clock.seconds, output)
        if not os.path.exists(report):
            last = output[-1] if output else "no output"
            return Outcome(cmd, "failed", f"the child died before reporting: {last}", clock.seconds, output)
        r = json.loads(Path(report).read_text())
    detail = r["detail"]
    if r["status"] == "failed":
        said = [line for line in output if line.strip()]
        if said:
            detail += f": {said[-1].strip()}"
    return Outcome(cmd, r["status"], detail, clock.seconds, output)


def run_all(cmds: Sequence[Command] | None = None, timeout: float = 60.0, echo: bool = False) -> list[Outcome]:
    """`run_one` for each command (all of the book's by default), one child at a time."""
    _preload()
    out = []
    for cmd in commands() if cmds is None else cmds:
        o = run_one(cmd, timeout)
        out.append(o)
        if echo:
            print(format_outcome(o), flush=True)
    return out


def _preload() -> None:
    """Import what most scripts import once, before the children are forked from this process."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.distributed.distributed_c10d  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    import pt215.launch  # noqa: F401


def format_outcome(o: Outcome) -> str:
    mark = {"boundary": "reached", "finished": "finished", "failed": "FAILED"}[o.status]
    return f"{mark:<8}  {o.command.where}  {o.command.shell()}\n          {o.detail}"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pt215.verify.boundary [--list] [--only TEXT] [--timeout S]`; exit code 1 if any command failed."""
    p = argparse.ArgumentParser(prog="python -m pt215.verify.boundary", description=__doc__.split("\n")[0])
    p.add_argument("--list", action="store_true", help="only list the commands derived from the notebooks")
    p.add_argument("--only", help="only the commands whose script or notebook contains this text")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per command before it is killed")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.child:
        d = json.loads(a.child)
        c = d["cmd"]
        cmd = Command(c["notebook"], c["line"], c["script"], c["nproc"], tuple(c["args"]),
                      tuple(tuple(x) for x in c["env"]))  # type: ignore[misc]
        _child(cmd, Path(d["script"]), d["workdir"], d["report"])
        return 0
    if a.timeout <= 0:
        p.error(f"--timeout must be > 0 seconds, got {a.timeout}")
    cmds = [c for c in commands() if a.only is None or a.only in c.script or a.only in c.notebook]
    if a.list:
        for c in cmds:
            print(f"{c.where}  {c.shell()}")
        print(f"{len(cmds)} launched commands")
        return 0
    outcomes = run_all(cmds, a.timeout, echo=True)
    bad = [o for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(bad)} of {len(outcomes)} launched commands reach the hardware boundary on CPU "
          f"or finish; {len(bad)} fail before it")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
