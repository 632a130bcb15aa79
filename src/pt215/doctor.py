"""`python -m pt215.doctor`: check, in one command, that a machine can follow the book ("Running a workshop").

One line per check, with its verdict (ok / warn / fail / skip) and, for each warning or failure, the fix.
A `fail` means the machine cannot follow the CPU track of the workshop; everything that only a GPU or a Mac
adds is a `warn` or a `skip`. The exit code is 0 when nothing failed. `--json` prints a report for a
facilitator collecting them (machine summary + checks); `--upgrade` adds the rest of the environment checks of
the "Upgrading a job to 2.15" chapter (`pt215.upgrade.environment`, where the Python, torch, wheel and driver checks
the doctor runs are defined too).

Every failing line carries its cause: the exception a broken `import torch` raised, the last stderr line of
the kernel interpreter that failed, the last stderr lines of the rank that failed the 4-rank gloo job.
Memory and cores are the container's (cgroup v1 or v2 limits, CPU affinity) when they are smaller than the
host's, as on a JupyterHub pod.

Each check is a small function of its inputs (`check_gpus(devices)`); the `probe_*` functions gather those
inputs from this machine (the machine itself through `pt215.hardware`), so a test can fake any environment by
replacing a probe.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pt215.upgrade.environment import (
    Check,
    Torch,
    check_driver,
    check_macos_mps,
    check_python,
    check_torch,
    check_wheel,
    environment_checks,
    probe_driver,
    probe_macos,
    probe_torch,
)

__all__ = ["BOOK_DATA", "Torch", "collect", "main", "machine_summary"]

DISK_FAIL_GIB, DISK_WARN_GIB = 1.0, 5.0
# Total memory. Settings, not measurements: the largest measured peak of one notebook with its ranks (PSS) is in
# data/workshop/hub-sizing.json (about 2.3 GiB, notebook 11.4); MEM_FAIL_GIB leaves room for the OS and Jupyter.
MEM_FAIL_GIB, MEM_WARN_GIB = 4.0, 8.0
NPROC = 4  # ranks of the launch check: the chapters' multi-rank demos run 4
LAUNCH = f"{NPROC}-rank gloo job"
SECTION = "workshop/index"
# The files the chapters read, relative to the book's data folder.
BOOK_DATA = (
    "05-nvfp4-decoding/lm-dense.pt",
    "05-nvfp4-decoding/lm-moe.pt",
    "05-nvfp4-decoding/corpus.txt.gz",
    "02-flight-recorder/mystery/rank_0",
)


# ---------------------------------------------------------------- checks (pure functions of their inputs)


def check_gpus(devices: Sequence[tuple[str, str, float]]) -> Check:
    """`devices`: (name, sm_NN, memory GiB) per CUDA device."""
    if not devices:
        return Check("GPUs", "skip", "no CUDA GPU: the CPU track (every chapter runs; GPU cells print what they need)")
    names = ", ".join(sorted({f"{n} ({sm}, {mem:.0f} GiB)" for n, sm, mem in devices}))
    return Check("GPUs", "ok", f"{len(devices)}x {names}: {gpu_track(len(devices))}")


def gpu_track(n_gpus: int) -> str:
    """The workshop track `n_gpus` CUDA devices (>= 1) allow."""
    return "the >= 2 GPU track" if n_gpus >= 2 else "the one-GPU track"


def check_nccl(version: str | None, n_gpus: int) -> Check:
    if version is None:
        return Check("NCCL", "skip", "not in this wheel (the CPU track uses gloo)")
    if n_gpus >= 2:
        return Check("NCCL", "ok", version)
    return Check("NCCL", "ok", f"{version}; used with >= 2 GPUs (chapters 1, 2, 4)")


def check_cudnn(version: str | None, n_gpus: int) -> Check:
    if version is None:
        return Check("cuDNN", "skip", "not in this wheel (chapter 5's cuDNN attention cell needs it)")
    return Check("cuDNN", "ok", version if n_gpus else f"{version}; used with a GPU (chapter 5)")


def check_mps(system: str, macos: str | None, mps_built: bool, mps_available: bool) -> Check:
    """Whether torch can use Apple MPS here; the macOS version it needs is the `macos` check's."""
    if system != "Darwin":
        return Check("MPS", "skip", f"{system}: Apple MPS is for Macs (chapter 6 runs its CPU reference path)")
    version = macos or "unknown"
    if not mps_built or not mps_available:
        return Check("MPS", "warn", f"macOS {version}, MPS {'not available' if mps_built else 'not built'}",
                     fix="use an Apple Silicon Mac and the macOS arm64 wheel of torch")
    return Check("MPS", "ok", f"available on macOS {version}")


def check_package(name: str, version: str | None, chapter: str, required: bool = False) -> Check:
    if version is not None:
        return Check(name, "ok", f"{version} importable")
    verdict = "fail" if required else "warn"
    return Check(name, verdict, f"not installed: {chapter} shows its gated cells' one-line notes instead",
                 fix=f"pip install -r requirements.txt (pins {name})")


@dataclass(frozen=True)
class KernelProblem:
    """Why a kernelspec's own interpreter does not import torch and pt215: `cause`, and `starts` False when the
    interpreter is missing or does not start (Jupyter still offers such a kernel, and it dies at once)."""

    cause: str
    starts: bool = True

    def __str__(self) -> str:
        return self.cause


def check_kernel(kernels: Sequence[tuple[str, KernelProblem | None]]) -> Check:
    """`kernels`: (kernelspec name, None when its own interpreter imported torch and pt215, else the problem).

    A kernelspec whose interpreter is missing fails the check even when another kernel works: Jupyter still
    offers it, and a participant who picks it gets a kernel that dies at once."""
    good = [name for name, problem in kernels if problem is None]
    broken = [f"{name}: {p}" for name, p in kernels if p is not None and not p.starts]
    without = [f"{name}: {p}" for name, p in kernels if p is not None and p.starts]
    fix = ("python -m ipykernel install --user --name pt215 --display-name 'Python (pt215)' "
           "(run with the .venv's python)")
    if broken:
        return Check("Jupyter kernel", "fail", "kernel " + "; ".join(broken),
                     fix="remove it (jupyter kernelspec remove NAME) or reinstall it: " + fix)
    if good and not without:
        return Check("Jupyter kernel", "ok", f"{', '.join(good)} runs a Python that imports torch and pt215")
    if good:
        return Check("Jupyter kernel", "warn", f"{', '.join(good)} imports torch and pt215, but "
                     + "; ".join(without), fix=f"pick {good[0]} in Jupyter's kernel menu")
    if kernels:
        return Check("Jupyter kernel", "fail", "no kernel imports torch and pt215: " + "; ".join(without), fix=fix)
    return Check("Jupyter kernel", "fail", "no Python kernelspec found", fix=fix)


def check_disk(free_gib: float) -> Check:
    text = f"{free_gib:.1f} GiB free"
    if free_gib < DISK_FAIL_GIB:
        return Check("disk", "fail", f"{text}; the notebooks need {DISK_FAIL_GIB:g} GiB", fix="free disk space")
    if free_gib < DISK_WARN_GIB:
        return Check("disk", "warn", f"{text}; {DISK_WARN_GIB:g} GiB leaves room for dumps and checkpoints",
                     fix="free disk space")
    return Check("disk", "ok", text)


def check_memory(total_gib: float, available_gib: float, limited_by: str = "") -> Check:
    """`limited_by`: where the limit comes from when it is not the host's memory ("cgroup limit")."""
    text = f"{total_gib:.1f} GiB total, {available_gib:.1f} GiB available" + (f" ({limited_by})" if limited_by else "")
    if total_gib < MEM_FAIL_GIB:
        return Check("memory", "fail",
                     f"{text}; the book asks for {MEM_FAIL_GIB:g} GiB (its 4-rank notebooks peak above 2 GiB)",
                     fix="use a machine (or hub profile) with more memory")
    if available_gib < MEM_FAIL_GIB or total_gib < MEM_WARN_GIB:
        return Check("memory", "warn", f"{text}; close other programs and kernels before the 4-rank demos",
                     fix=f"free memory (aim for {MEM_WARN_GIB:g} GiB total)")
    return Check("memory", "ok", text)


def check_cores(cores: float, limited_by: str = "") -> Check:
    """`cores` this process may use (a cgroup CPU quota can make it fractional)."""
    text = f"{cores:g}" + (f" ({limited_by})" if limited_by else "")
    if cores < 2:
        return Check("CPU cores", "warn", f"{text}: the {NPROC}-rank demos run, slowly",
                     fix="use a machine (or hub profile) with 2+ cores")
    return Check("CPU cores", "ok", text)


def check_fp8(problem: str | None) -> Check:
    """`problem`: `pt215.fp8.cpu_fp8_matmul_problem()`, None when `torch._scaled_mm` runs on this CPU."""
    if problem is None:
        return Check("FP8 on CPU", "ok", "torch._scaled_mm runs on float8_e4m3fn CPU tensors (chapter 6)")
    return Check("FP8 on CPU", "warn", f"{problem}: only tensorwise torch._scaled_mm fails here; F.scaled_mm and "
                 "rowwise torch._scaled_mm take the reference path (dequantize + fp32 matmul), as notebook 6.1 shows",
                 fix="nothing to do for the notebooks; for FP8 kernels run chapter 6 on a GPU or a Mac, or on a CPU "
                     "where oneDNN builds them")


def check_cxx(outcome: tuple[bool, str] | None) -> Check:
    """`outcome`: (compiles, first error) of a torch header compiled as C++20 (`probe_cxx`); None: no compiler."""
    if outcome is None:
        return Check("C++ compiler (chapter 9)", "warn", "no C++ compiler found (c++, g++ or $CXX)",
                     fix="install one (Debian/Ubuntu: apt install g++; macOS: xcode-select --install) to build the "
                         "chapter 9 extensions; every other chapter runs without it")
    ok, error = outcome
    if ok:
        return Check("C++ compiler (chapter 9)", "ok", "compiles torch 2.15's headers as C++20")
    return Check("C++ compiler (chapter 9)", "warn", f"cannot compile torch 2.15's headers as C++20: {error}",
                 fix="use a compiler with C++20 support (GCC >= 10, Clang >= 12) and point CXX at it")


def failure_cause(lines: Sequence[str], n: int = 2) -> str:
    """The cause in a failed process's last output lines: the exception line of a traceback, else the last
    `n` non-empty lines joined by ' | ' (gloo's `[enforce fail at FILE:LINE]` prefix removed)."""
    text = [line.strip() for line in lines if line.strip()]
    found = [line for line in text if _EXC_LINE.match(line)]
    picked = [found[-1]] if found else text[-n:]
    out = " | ".join(_ENFORCE.sub("", line) for line in picked)
    return out or "(no output)"


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Timeout)\w*:")
_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\]\s*")


def _launch_fix(cause: str) -> str:
    m = re.search(r"Unable to find address for:?\s*(\S+)", cause)
    if m:
        return (f"GLOO_SOCKET_IFNAME={m.group(1)} names no network interface of this machine: unset it "
                "(unset GLOO_SOCKET_IFNAME) or set it to one that `ip -br addr` lists, e.g. lo")
    return "run chapters/00-before-you-start/00-1-environment and read its troubleshooting"


def check_launch(outcome: dict) -> Check:
    """`outcome` of the 4-rank gloo job: `error` (str) with its `cause` (the failing rank's last stderr lines),
    or `results` ({rank: report}); and `left` (processes left afterwards)."""
    left = outcome.get("left", 0)
    if outcome.get("error"):
        cause = outcome.get("cause") or "(no output)"
        return Check(LAUNCH, "fail", f"{outcome['error']}: {cause}", fix=_launch_fix(cause))
    results = outcome.get("results", {})
    want = float(sum(range(NPROC)))
    sums = {results.get(r, {}).get("sum") for r in range(NPROC)}
    if sums != {want}:
        return Check(LAUNCH, "fail", f"ranks reported {results!r}; expected an all-reduce sum of {want:g}",
                     fix=_launch_fix(""))
    if left:
        return Check(LAUNCH, "fail", f"all-reduce ok but {left} process(es) left behind",
                     fix="report it: pt215.launch.run must leave no process")
    return Check(LAUNCH, "ok", f"{NPROC} ranks all-reduced over gloo, reported back, no process left")


def check_data(missing: Sequence[str], folder: str) -> Check:
    if missing:
        return Check("book data", "fail", f"missing under {folder}: {'; '.join(missing)}",
                     fix="run from a full clone of the book (the data/ folder ships with it)")
    return Check("book data", "ok", f"{len(BOOK_DATA)} files found (model weights, corpus, mystery dumps)")


# ---------------------------------------------------------------- probes (this machine)


def probe_package(name: str) -> str | None:
    """Version of an importable package, or None."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def _kernel_python(argv: Sequence[str]) -> str:
    # jupyter_client runs `python`/`python3`/`python3.N` kernels with the Python that starts them.
    first = argv[0] if argv else ""
    if first in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}:
        return sys.executable
    return first


_KERNEL_CODE = "import torch, pt215; print(torch.__version__)"


def kernel_problem(argv: Sequence[str], env: dict | None = None, timeout: float = 120.0) -> KernelProblem | None:
    """Start a kernelspec's own interpreter (its `argv[0]`, with its `env`) and import torch and pt215 in it:
    None when that works, else the problem (missing interpreter, or the last stderr line of the import)."""
    exe = _kernel_python(argv)
    if not exe:
        return KernelProblem("its kernelspec has an empty argv", starts=False)
    found = shutil.which(exe) if os.sep not in exe and "/" not in exe else (exe if os.path.isfile(exe) else None)
    if found is None:
        return KernelProblem(f"its interpreter {exe} does not exist", starts=False)
    try:
        out = subprocess.run([found, "-c", _KERNEL_CODE], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **{str(k): str(v) for k, v in (env or {}).items()}})
    except subprocess.TimeoutExpired:
        return KernelProblem(f"its interpreter {exe} did not import torch within {timeout:g} s")
    except OSError as e:
        return KernelProblem(f"its interpreter {exe} does not start ({e.strerror or e})", starts=False)
    if out.returncode != 0:
        return KernelProblem(f"{exe} -c 'import torch, pt215' fails: {failure_cause(out.stderr.splitlines())}")
    return None


def probe_kernels() -> list[tuple[str, KernelProblem | None]]:
    """(name, None or why it fails) for each Python kernelspec jupyter_client finds."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return []
    out = []
    for name, info in sorted(KernelSpecManager().get_all_specs().items()):
        spec = info.get("spec", {})
        if spec.get("language", "").lower() != "python":
            continue
        out.append((name, kernel_problem(spec.get("argv", []), spec.get("env"))))
    return out


def probe_disk() -> float:
    from pt215.book_files import BookFilesError, book_root

    try:
        where = book_root()
    except BookFilesError:
        where = Path.cwd()
    return shutil.disk_usage(where).free / 2**30


@dataclass(frozen=True)
class Cgroup:
    """Limits of this process's control group; None where there is none."""

    memory_max: int | None = None    # bytes
    memory_used: int | None = None   # bytes, without the reclaimable page cache
    cpus: float | None = None        # CPU quota in cores


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _inactive_file(stat: Path) -> int:
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def read_cgroup(proc_self_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> Cgroup:
    """The memory and CPU limits of the cgroup named in `proc_self_cgroup` (the text of /proc/self/cgroup),
    read under `root`, v2 (`0::/path`) or v1 (`N:memory:/path`, `N:cpu,cpuacct:/path`); the smallest limit
    from the group up to the root counts. A container sees its own group at the root of `root`."""
    paths: dict[str, str] = {}
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2].strip("/")

    def chain(base: Path, rel: str) -> list[Path]:
        # the group and its parents; the group path as the host names it may not exist inside a container
        here = base / rel if rel else base
        out = [here, *[p for p in here.parents if base == p or base in p.parents]] if here.is_dir() else [base]
        return [p for p in out if p.is_dir()]

    mem_max: float | None = None
    used: int | None = None
    cpus: float | None = None
    if "" in paths and (root / "cgroup.controllers").exists():  # v2
        groups = chain(root, paths[""])
        for g in groups:
            mem_max = _min(mem_max, _read_int(g / "memory.max"))
            try:
                quota, period = (g / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    cpus = _min(cpus, int(quota) / int(period))
            except (OSError, ValueError):
                pass
        if groups and (cur := _read_int(groups[0] / "memory.current")) is not None:
            used = max(0, cur - _inactive_file(groups[0] / "memory.stat"))
    else:  # v1
        mem_base = root / "memory"
        if "memory" in paths and mem_base.is_dir():
            groups = chain(mem_base, paths["memory"])
            for g in groups:
                limit = _read_int(g / "memory.limit_in_bytes")
                if limit is not None and limit < 2**60:  # v1 writes a huge number for "no limit"
                    mem_max = _min(mem_max, limit)
            if groups and (cur := _read_int(groups[0] / "memory.usage_in_bytes")) is not None:
                used = max(0, cur - _inactive_file(groups[0] / "memory.stat"))
        cpu_base = next((root / n for n in ("cpu,cpuacct", "cpu") if (root / n).is_dir()), None)
        if "cpu" in paths and cpu_base is not None:
            for g in chain(cpu_base, paths["cpu"]):
                quota, period = _read_int(g / "cpu.cfs_quota_us"), _read_int(g / "cpu.cfs_period_us")
                if quota is not None and quota > 0 and period:
                    cpus = _min(cpus, quota / period)
    return Cgroup(int(mem_max) if mem_max is not None else None, used, cpus)


def probe_cgroup() -> Cgroup:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return Cgroup()
    return read_cgroup(text)


def effective_memory(host_total: float, host_available: float, cg: Cgroup) -> tuple[float, float, str]:
    """(total, available, limited_by) in bytes: the cgroup's limit when it is below the host's memory."""
    if cg.memory_max is None or cg.memory_max >= host_total:
        return host_total, host_available, ""
    avail = cg.memory_max - (cg.memory_used or 0)
    return float(cg.memory_max), float(max(0.0, min(host_available, avail))), "cgroup limit"


def effective_cores(host: int, affinity: int | None, cg: Cgroup) -> tuple[float, str]:
    """(cores, limited_by): the smallest of the host's cores, the CPU affinity and the cgroup quota."""
    cores: float = host
    by = ""
    if affinity is not None and affinity < cores:
        cores, by = affinity, "CPU affinity"
    if cg.cpus is not None and cg.cpus < cores:
        cores, by = round(cg.cpus, 2), "cgroup CPU quota"
    return cores, by


def probe_memory() -> tuple[float, float, str]:
    """(total GiB, available GiB, limited_by) for this process: the host's, or its cgroup's limit."""
    import psutil

    vm = psutil.virtual_memory()
    total, avail, by = effective_memory(float(vm.total), float(vm.available), probe_cgroup())
    return total / 2**30, avail / 2**30, by


def probe_cores() -> tuple[float, str]:
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        affinity = None
    return effective_cores(os.cpu_count() or 1, affinity, probe_cgroup())


def probe_fp8() -> str | None:
    """`pt215.fp8.cpu_fp8_matmul_problem()`: None when torch._scaled_mm runs on this CPU, else why not."""
    from pt215.fp8 import cpu_fp8_matmul_problem

    return cpu_fp8_matmul_problem()


_GLOO_SCRIPT = """\
import torch
import torch.distributed as dist
from pt215.launch import init_rank, report, shutdown

me = init_rank("gloo")
t = torch.tensor([float(me.rank)])
dist.all_reduce(t)
report({"sum": t.item(), "world": me.world})
shutdown()
"""


def probe_cxx() -> tuple[bool, str] | None:
    """Compile one torch header as C++20 with the system compiler (`pt215.native.syntax_check`); None: none found."""
    from pt215.native import syntax_check

    try:
        r = syntax_check("#include <c10/util/Bitset.h>\nint main() { return 0; }\n")
    except RuntimeError:
        return None
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"the compiler did not run ({type(e).__name__})"
    return r.ok, r.first_error


def probe_launch(timeout: float = 120.0, env: dict[str, str] | None = None) -> dict:
    """Run a 4-rank gloo all-reduce through `pt215.launch.run`; count processes left afterwards. On a
    failure, `error` says which rank failed and `cause` quotes its last stderr lines."""
    from pt215.launch import LaunchError, LaunchTimeoutError, RankFailedError, run, running_processes

    folder = Path(tempfile.mkdtemp(prefix="pt215-doctor-"))
    script = folder / f"pt215_doctor_{uuid.uuid4().hex[:8]}.py"
    script.write_text(_GLOO_SCRIPT)
    try:
        res = run(script, nproc=NPROC, timeout=timeout, env=env, stream=False, show=False)
        outcome: dict = {"results": res.results}
    except RankFailedError as e:
        code = "unknown" if e.exitcode is None else e.exitcode
        outcome = {"error": f"rank {e.rank} failed (exit code {code})", "cause": failure_cause(e.last_output)}
    except LaunchTimeoutError as e:
        waiting = "; ".join(f"rank {r}: {failure_cause(lines, 1)}" for r, lines in sorted(e.last_output.items()))
        outcome = {"error": f"did not finish within {timeout:g} s", "cause": waiting}
    except (LaunchError, OSError) as e:
        outcome = {"error": type(e).__name__, "cause": failure_cause(str(e).splitlines())}
    finally:
        outcome_left = running_processes(script.name)
        shutil.rmtree(folder, ignore_errors=True)
    outcome["left"] = outcome_left
    return outcome


def probe_data() -> list[str]:
    """The book data files this installation lacks, each with `pt215.book_files`' reason."""
    from pt215.book_files import BookFilesError, data_path

    missing = []
    for name in BOOK_DATA:
        try:
            data_path(name)
        except BookFilesError as e:
            missing.append(f"{name} ({e})")
    return missing


# ---------------------------------------------------------------- the report


def collect(launch: bool = True, t: Torch | None = None) -> list[Check]:
    """Every check, in the order they are printed. `launch=False` skips the 4-rank job; `t`: the installed torch
    (`probe_torch()` when None)."""
    t = probe_torch() if t is None else t
    driver_cuda, driver = probe_driver() if t.cuda else (None, None)
    n, macos = len(t.devices), probe_macos()
    checks = [
        check_python(sys.version_info[:3]),
        check_torch(t.version, t.error, t.installed),
        check_wheel(t.cuda, t.hip, t.mps_built),
        check_gpus(t.devices),
        check_driver(t.cuda, n, driver, driver_cuda),
        check_nccl(t.nccl, n),
        check_cudnn(t.cudnn, n),
        check_mps(platform.system(), macos, t.mps_built, t.mps_available),
        check_macos_mps(macos),
        check_package("nixl", probe_package("nixl"), "chapter 3"),
        check_package("torchao", probe_package("torchao"), "chapter 5 (the NVFP4 cross-check)"),
        check_kernel(probe_kernels()),
        check_cores(*probe_cores()),
        check_memory(*probe_memory()),
        check_disk(probe_disk()),
        check_data(probe_data(), "data/"),
    ]
    if t.version is not None:
        checks.append(check_fp8(probe_fp8()))
        checks.append(check_cxx(probe_cxx()))
    else:
        checks.append(Check("FP8 on CPU", "skip", "torch is not importable"))
    if launch and t.version is not None:
        checks.append(check_launch(probe_launch()))
    elif launch:
        checks.append(Check(LAUNCH, "skip", "torch is not importable"))
    return [c if c.section else Check(c.name, c.verdict, c.detail, c.fix, SECTION) for c in checks]


def machine_summary() -> dict:
    """Who ran the doctor where: for a facilitator's table of reports."""
    try:
        from pt215.hardware import report

        hw: dict = report().as_dict()
    except ImportError:
        hw = {}
    return {"host": platform.node(), "system": platform.system(), "machine": platform.machine(),
            "python": platform.python_version(), "date": dt.datetime.now().isoformat(timespec="seconds"), **hw}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pt215.doctor [--json] [--upgrade] [--no-launch]`: 0 when the machine can follow the CPU track."""
    p = argparse.ArgumentParser(prog="python -m pt215.doctor", description=main.__doc__)
    p.add_argument("--json", action="store_true", help="print a JSON report (machine summary + checks)")
    p.add_argument("--upgrade", action="store_true", help="also run the 'Upgrading a job to 2.15' environment checks")
    p.add_argument("--no-launch", action="store_true", help=f"skip the {LAUNCH}")
    a = p.parse_args(argv)
    t = probe_torch()
    checks = collect(launch=not a.no_launch, t=t)
    if a.upgrade:  # the checklist's checks the doctor has not run already (python, torch, wheel, driver are shared)
        done = {c.name for c in checks}
        checks += [c for c in environment_checks() if c.name not in done]
    failed = [c for c in checks if c.verdict == "fail"]
    code = 1 if failed else 0
    if a.json:
        print(json.dumps({"machine": machine_summary(), "exit_code": code,
                          "counts": {v: sum(c.verdict == v for c in checks) for v in ("ok", "warn", "fail", "skip")},
                          "checks": [c.as_dict() for c in checks]}, indent=1))
        return code
    for c in checks:
        print(c.line())
    verdict = ("cannot follow the CPU track: fix the failed checks above" if failed
               else "ready for the CPU track" + _tracks(len(t.devices), checks))
    print(f"{len(checks)} checks: {verdict}")
    return code


def _tracks(n_gpus: int, checks: Sequence[Check]) -> str:
    """The tracks beyond the CPU one: the GPUs' (`gpu_track`), and the Apple Silicon track when MPS is available
    on a macOS it supports."""
    verdicts = {c.name: c.verdict for c in checks}
    extra = [gpu_track(n_gpus)] if n_gpus else []
    if verdicts.get("MPS") == verdicts.get("macos") == "ok":
        extra.append("the Apple Silicon track")
    return (" and " + " and ".join(extra)) if extra else ""


if __name__ == "__main__":
    raise SystemExit(main())
