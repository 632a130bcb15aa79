"""`python -m pt215.doctor`: check, in one command, that a machine can follow the book ("Running a workshop").

One line per check, with its verdict (ok / warn / fail / skip) and, for each warning or failure, the fix.
A `fail` means the machine cannot follow the CPU track of the workshop; everything that only a GPU or a Mac
adds is a `warn` or a `skip`. The exit code is 0 when nothing failed. `--json` prints a report for a
facilitator collecting them (machine summary + checks); `--upgrade` adds the environment checks of the
"Upgrading a job to 2.15" chapter (`pt215.upgrade_checks`).

Each check is a small function of its inputs (`check_torch(version, cuda, ...)`); the `probe_*` functions
gather those inputs from this machine, so a test can fake any environment by replacing a probe.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pt215.checks import Check

__all__ = ["BOOK_DATA", "collect", "main", "machine_summary"]

TORCH_WANTED = "2.15.0"
PYTHON_MIN = (3, 11)
WHEEL_CUDA = ("13.2", "13.4")  # the CUDA builds of torch 2.15.0 the book covers
DISK_FAIL_GIB, DISK_WARN_GIB = 1.0, 5.0
MEM_FAIL_GIB, MEM_WARN_GIB = 4.0, 8.0  # total memory; a 4-rank demo peaks near 4.6 GiB of summed RSS (hub sizing)
SECTION = "workshop/index"
# The files the chapters read, relative to the book's data folder.
BOOK_DATA = (
    "05-nvfp4-decoding/lm-dense.pt",
    "05-nvfp4-decoding/lm-moe.pt",
    "05-nvfp4-decoding/corpus.txt.gz",
    "02-flight-recorder/mystery/rank_0",
)


# ---------------------------------------------------------------- checks (pure functions of their inputs)


def check_python(version: tuple[int, int, int]) -> Check:
    text = ".".join(map(str, version))
    if tuple(version[:2]) >= PYTHON_MIN:
        return Check("Python", "ok", text)
    return Check("Python", "fail", f"{text} is older than {PYTHON_MIN[0]}.{PYTHON_MIN[1]}",
                 fix=f"install Python >= {PYTHON_MIN[0]}.{PYTHON_MIN[1]} and re-run scripts/setup.sh")


def wheel_kind(cuda: str | None, hip: str | None, mps_built: bool) -> str:
    """Which build of torch this is: `CUDA 13.2`, `ROCm ...`, `MPS` (macOS) or `CPU`."""
    if cuda:
        return f"CUDA {cuda}"
    if hip:
        return f"ROCm {hip}"
    return "MPS" if mps_built else "CPU"


def check_torch(version: str | None, cuda: str | None, hip: str | None = None, mps_built: bool = False) -> Check:
    fix = f"pip install torch=={TORCH_WANTED} (in the book's .venv: bash scripts/setup.sh)"
    if version is None:
        return Check("torch", "fail", "not importable", fix=fix)
    kind = wheel_kind(cuda, hip, mps_built)
    base = version.split("+")[0]
    if base != TORCH_WANTED:
        return Check("torch", "fail", f"{version} ({kind} wheel); the book needs {TORCH_WANTED}", fix=fix)
    if cuda and cuda not in WHEEL_CUDA:
        return Check("torch", "warn", f"{version}, {kind} wheel (the book was checked with CUDA "
                     f"{' and '.join(WHEEL_CUDA)})",
                     fix="use the CUDA 13.2 wheel from PyPI (pip install torch==2.15.0)")
    if hip:
        return Check("torch", "warn", f"{version}, {kind} wheel: GPU cells are written for CUDA",
                     fix="follow the CPU track, or use the CUDA wheel on an NVIDIA machine")
    return Check("torch", "ok", f"{version}, {kind} wheel")


def check_gpus(devices: Sequence[tuple[str, str, float]]) -> Check:
    """`devices`: (name, sm_NN, memory GiB) per CUDA device."""
    if not devices:
        return Check("GPUs", "skip", "no CUDA GPU: the CPU track (every chapter runs; GPU cells print what they need)")
    names = ", ".join(sorted({f"{n} ({sm}, {mem:.0f} GiB)" for n, sm, mem in devices}))
    track = "the >= 2 GPU track" if len(devices) >= 2 else "the one-GPU track"
    return Check("GPUs", "ok", f"{len(devices)}x {names}: {track}")


def check_driver(wheel_cuda: str | None, driver_cuda: tuple[int, int] | None, driver: str | None,
                 n_gpus: int) -> Check:
    """Does the NVIDIA driver support the CUDA version the wheel was built with?"""
    if not wheel_cuda:
        return Check("NVIDIA driver", "skip", "not a CUDA wheel")
    if driver_cuda is None:
        if n_gpus:
            return Check("NVIDIA driver", "warn", "GPUs found but the driver's CUDA version could not be read",
                         fix="check nvidia-smi")
        return Check("NVIDIA driver", "skip", "no NVIDIA driver (fine for the CPU track)")
    have = f"{driver_cuda[0]}.{driver_cuda[1]}"
    shown = f"driver {driver} " if driver else "driver "
    want = tuple(int(x) for x in wheel_cuda.split(".")[:2])
    if driver_cuda[0] < want[0]:
        return Check("NVIDIA driver", "warn", f"{shown}supports CUDA {have}; the wheel needs CUDA {wheel_cuda}: "
                     "torch will not see the GPUs",
                     fix=f"install an NVIDIA driver for CUDA {want[0]}.x (R580 or newer)")
    if driver_cuda < want:
        return Check("NVIDIA driver", "warn", f"{shown}supports CUDA {have} < {wheel_cuda}: runs through CUDA minor-"
                     "version compatibility (no PTX JIT)",
                     fix=f"update the driver to one that supports CUDA {wheel_cuda}")
    return Check("NVIDIA driver", "ok", f"{shown}supports CUDA {have} (wheel: CUDA {wheel_cuda})")


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
    if system != "Darwin":
        return Check("MPS", "skip", f"{system}: Apple MPS is for Macs (chapter 6 runs its CPU reference path)")
    version = macos or "unknown"
    major = int(re.match(r"\d+", version).group(0)) if re.match(r"\d+", version) else 0
    if not mps_built or not mps_available:
        return Check("MPS", "warn", f"macOS {version}, MPS {'not available' if mps_built else 'not built'}",
                     fix="use an Apple Silicon Mac and the macOS arm64 wheel of torch")
    if major < 15:
        return Check("MPS", "warn", f"macOS {version}: chapter 6's FP8 cells need macOS >= 15",
                     fix="update macOS to 15 or later")
    return Check("MPS", "ok", f"available on macOS {version}: the Apple Silicon track")


def check_package(name: str, version: str | None, chapter: str, required: bool = False) -> Check:
    if version is not None:
        return Check(name, "ok", f"{version} importable")
    verdict = "fail" if required else "warn"
    return Check(name, verdict, f"not installed: {chapter} shows its gated cells' one-line notes instead",
                 fix=f"pip install -r requirements.txt (pins {name})")


def check_kernel(kernels: Sequence[tuple[str, bool]]) -> Check:
    """`kernels`: (kernelspec name, its Python can import torch and pt215) for each Python kernelspec."""
    good = [name for name, sees in kernels if sees]
    fix = ("python -m ipykernel install --user --name pt215 --display-name 'Python (pt215)' "
           "(run with the .venv's python)")
    if good:
        return Check("Jupyter kernel", "ok", f"{', '.join(good)} runs a Python with torch and pt215")
    if kernels:
        names = ", ".join(name for name, _ in kernels)
        return Check("Jupyter kernel", "fail", f"kernels {names} run a Python without torch or pt215", fix=fix)
    return Check("Jupyter kernel", "fail", "no Python kernelspec found", fix=fix)


def check_disk(free_gib: float) -> Check:
    text = f"{free_gib:.1f} GiB free"
    if free_gib < DISK_FAIL_GIB:
        return Check("disk", "fail", f"{text}; the notebooks need {DISK_FAIL_GIB:g} GiB", fix="free disk space")
    if free_gib < DISK_WARN_GIB:
        return Check("disk", "warn", f"{text}; {DISK_WARN_GIB:g} GiB leaves room for dumps and checkpoints",
                     fix="free disk space")
    return Check("disk", "ok", text)


def check_memory(total_gib: float, available_gib: float) -> Check:
    text = f"{total_gib:.1f} GiB total, {available_gib:.1f} GiB available"
    if total_gib < MEM_FAIL_GIB:
        return Check("memory", "fail", f"{text}; the 4-rank demos need {MEM_FAIL_GIB:g} GiB",
                     fix="use a machine (or hub profile) with more memory")
    if available_gib < MEM_FAIL_GIB or total_gib < MEM_WARN_GIB:
        return Check("memory", "warn", f"{text}; close other programs before the 4-rank demos",
                     fix=f"free memory (aim for {MEM_WARN_GIB:g} GiB total)")
    return Check("memory", "ok", text)


def check_cores(cores: int) -> Check:
    if cores < 2:
        return Check("CPU cores", "warn", f"{cores}: multi-rank demos run, slowly", fix="use a machine with 2+ cores")
    return Check("CPU cores", "ok", str(cores))


def check_launch(outcome: dict) -> Check:
    """`outcome` of the 2-rank gloo job: `error` (str) or `results` ({rank: report}), and `left` (processes)."""
    left = outcome.get("left", 0)
    fix = "run chapters/00-before-you-start/00-1-environment and read its troubleshooting"
    if outcome.get("error"):
        return Check("2-rank gloo job", "fail", f"pt215.launch.run failed: {outcome['error']}", fix=fix)
    results = outcome.get("results", {})
    sums = {results.get(r, {}).get("sum") for r in (0, 1)}
    if sums != {1.0}:
        return Check("2-rank gloo job", "fail", f"ranks reported {results!r}; expected an all-reduce sum of 1.0",
                     fix=fix)
    if left:
        return Check("2-rank gloo job", "fail", f"all-reduce ok but {left} process(es) left behind",
                     fix="report it: pt215.launch.run must leave no process")
    return Check("2-rank gloo job", "ok", "2 ranks all-reduced over gloo, reported back, no process left")


def check_data(missing: Sequence[str], folder: str) -> Check:
    if missing:
        return Check("book data", "fail", f"missing under {folder}: {'; '.join(missing)}",
                     fix="run from a full clone of the book (the data/ folder ships with it)")
    return Check("book data", "ok", f"{len(BOOK_DATA)} files found (model weights, corpus, mystery dumps)")


# ---------------------------------------------------------------- probes (this machine)


@dataclass
class Torch:
    version: str | None
    cuda: str | None = None
    hip: str | None = None
    mps_built: bool = False
    mps_available: bool = False
    nccl: str | None = None
    cudnn: str | None = None
    devices: tuple[tuple[str, str, float], ...] = ()


def probe_torch() -> Torch:
    try:
        import torch
    except ImportError:
        return Torch(None)
    from pt215 import hardware

    hw = hardware.report()
    return Torch(
        version=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
        mps_built=hw.mps_built, mps_available=hw.mps_available, nccl=hw.nccl, cudnn=hw.cudnn,
        devices=tuple((d.name, d.sm, d.memory_gib) for d in hw.cuda_devices),
    )


def probe_driver() -> tuple[tuple[int, int] | None, str | None]:
    """(CUDA version the driver supports, driver version) from libcuda and nvidia-smi; (None, None) without one."""
    cuda = None
    name = ctypes.util.find_library("cuda") or ("libcuda.so.1" if sys.platform.startswith("linux") else None)
    if name:
        try:
            lib = ctypes.CDLL(name)
            v = ctypes.c_int()
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
                cuda = (v.value // 1000, (v.value % 1000) // 10)
        except (OSError, AttributeError):
            cuda = None
    driver = None
    smi = shutil.which("nvidia-smi")
    if smi and cuda:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            driver = None
    return cuda, driver


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


def probe_kernels() -> list[tuple[str, bool]]:
    """(name, sees torch and pt215) for each Python kernelspec jupyter_client finds."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return []
    out = []
    for name, info in sorted(KernelSpecManager().get_all_specs().items()):
        spec = info.get("spec", {})
        if spec.get("language", "").lower() != "python":
            continue
        exe = _kernel_python(spec.get("argv", []))
        code = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') and u.find_spec('pt215') else 3)"
        try:
            ok = subprocess.run([exe, "-c", code], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        out.append((name, ok))
    return out


def probe_disk() -> float:
    from pt215.book_files import BookFilesError, book_root

    try:
        where = book_root()
    except BookFilesError:
        where = Path.cwd()
    return shutil.disk_usage(where).free / 2**30


def probe_memory() -> tuple[float, float]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.total / 2**30, vm.available / 2**30


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


def probe_launch(timeout: float = 90.0) -> dict:
    """Run a 2-rank gloo all-reduce through `pt215.launch.run`; count processes left afterwards."""
    from pt215.launch import LaunchError, run, running_processes

    folder = Path(tempfile.mkdtemp(prefix="pt215-doctor-"))
    script = folder / f"pt215_doctor_{uuid.uuid4().hex[:8]}.py"
    script.write_text(_GLOO_SCRIPT)
    try:
        res = run(script, nproc=2, timeout=timeout, stream=False, show=False)
        outcome: dict = {"results": res.results}
    except (LaunchError, OSError) as e:
        outcome = {"error": str(e).splitlines()[0]}
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


def collect(launch: bool = True) -> list[Check]:
    """Every check, in the order they are printed. `launch=False` skips the 2-rank job."""
    t = probe_torch()
    driver_cuda, driver = probe_driver()
    n = len(t.devices)
    checks = [
        check_python(tuple(sys.version_info[:3])),
        check_torch(t.version, t.cuda, t.hip, t.mps_built),
        check_gpus(t.devices),
        check_driver(t.cuda, driver_cuda, driver, n),
        check_nccl(t.nccl, n),
        check_cudnn(t.cudnn, n),
        check_mps(platform.system(), platform.mac_ver()[0] or None, t.mps_built, t.mps_available),
        check_package("nixl", probe_package("nixl"), "chapter 3"),
        check_package("torchao", probe_package("torchao"), "chapter 5 (the NVFP4 cross-check)"),
        check_kernel(probe_kernels()),
        check_cores(os.cpu_count() or 1),
        check_memory(*probe_memory()),
        check_disk(probe_disk()),
        check_data(probe_data(), "data/"),
    ]
    if launch and t.version is not None:
        checks.append(check_launch(probe_launch()))
    elif launch:
        checks.append(Check("2-rank gloo job", "skip", "torch is not importable"))
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


def _upgrade_checks() -> Callable[[], list[Check]] | None:
    try:
        from pt215.upgrade_checks import environment_checks
    except ImportError:
        return None
    return environment_checks


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pt215.doctor [--json] [--upgrade] [--no-launch]`: 0 when the machine can follow the CPU track."""
    p = argparse.ArgumentParser(prog="python -m pt215.doctor", description=main.__doc__)
    p.add_argument("--json", action="store_true", help="print a JSON report (machine summary + checks)")
    p.add_argument("--upgrade", action="store_true", help="also run the 'Upgrading a job to 2.15' environment checks")
    p.add_argument("--no-launch", action="store_true", help="skip the 2-rank gloo job")
    a = p.parse_args(argv)
    extra: list[Check] = []
    if a.upgrade:
        fn = _upgrade_checks()
        if fn is None:
            print("pt215.doctor --upgrade: the module pt215.upgrade_checks is not installed in this pt215; "
                  "update the book (git pull) and re-run scripts/setup.sh", file=sys.stderr)
            return 2
        extra = list(fn())
    checks = collect(launch=not a.no_launch) + extra
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
               else "ready for the CPU track" + _tracks(checks))
    print(f"{len(checks)} checks: {verdict}")
    return code


def _tracks(checks: Sequence[Check]) -> str:
    by = {c.name: c for c in checks}
    extra = []
    gpus = by.get("GPUs")
    if gpus is not None and gpus.verdict == "ok":
        extra.append(gpus.detail.rsplit(": ", 1)[-1])
    mps = by.get("MPS")
    if mps is not None and mps.verdict == "ok":
        extra.append("the Apple Silicon track")
    return (" and " + " and ".join(extra)) if extra else ""


if __name__ == "__main__":
    raise SystemExit(main())
