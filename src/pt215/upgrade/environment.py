"""The environment checks for this machine: chapter 7's upgrade checklist, and the ones `pt215.doctor` shares.

`environment_checks()` returns one `Check` per item of the chapter 7 checklist ("Upgrading a job to
2.15"): ok / warn / fail, or skip where the item does not apply here (no GPU, not macOS, not ROCm).
`python -m pt215.doctor` runs the Python, torch, wheel and driver checks from here too ("Running a workshop"), and
`--upgrade` adds the rest. Each check is a function of its inputs only, so each verdict can be tested on any
machine; the `probe_*` functions read those inputs from this one (the machine itself through `pt215.hardware`).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pt215.flight import ENV_VARS

__all__ = ["Check", "Verdict", "VERDICTS", "environment_checks", "check_python", "check_torch", "check_wheel",
           "check_driver", "check_nccl_backend", "check_nccl_version", "check_rccl_version", "check_macos_mps",
           "check_fr_env", "check_nccl2_env", "check_target_version", "check_weights_only_env", "check_fr_buffer",
           "NCCL_GATES", "FR_LEGACY", "TORCH_WANTED", "Torch", "probe_torch", "probe_driver", "probe_nccl",
           "probe_nccl_loaded", "nccl_code_version",
           "probe_nccl_backend", "probe_macos", "probe_headers_abi"]

Verdict = Literal["ok", "warn", "fail", "skip"]
VERDICTS: tuple[Verdict, ...] = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True)
class Check:
    """A named check: its verdict, what was found, how to fix a warn/fail, and the book section that explains it."""

    name: str
    verdict: Verdict
    detail: str
    fix: str = ""
    section: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Check.verdict must be one of {', '.join(VERDICTS)}; got {self.verdict!r}")

    def line(self) -> str:
        """One line for a terminal: `[verdict] name: detail` and, for warn/fail, `-> fix`."""
        text = f"[{self.verdict}] {self.name}: {self.detail}"
        if self.fix and self.verdict in ("warn", "fail"):
            text += f" -> {self.fix}"
        return text

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


S_PY = "chapter 7, Python and wheels"
S_MIG = "chapter 1, Migration plan"
S_FR = "chapter 2, The settings"
S_CPP = "chapter 7, C++ extensions"
S_LOAD = "chapter 7, torch.load"
S_MPS = "chapter 6, Where each piece runs"

TORCH_WANTED = "2.15.0"
#: CPython versions the 2.15.0 wheels are published for (`Requires-Python: >=3.11`, classifiers 3.11-3.15).
PYTHONS = ((3, 11), (3, 15))
#: The CUDA builds of torch 2.15.0: 13.2 is PyPI's default wheel, 13.4 the alternative.
WHEEL_CUDA = ("13.2", "13.4")
#: The oldest driver branch of each CUDA major version (CUDA minor-version compatibility).
DRIVER_BRANCH = {12: 525, 13: 580}
#: NCCL versions the 2.15 NCCL2 backend's headers gate features on at compile time (`#if NCCL_VERSION_CODE` in
#: `nccl2/NcclApi.hpp`, `nccl2/ProcessGroupNCCL.hpp`): what a torch built against that NCCL can offer. The 2.15
#: wheel is built against 2.30.7 and imports every one of these entry points as a strong symbol, so at run time an
#: older NCCL does not fall under a gate: `import torch` fails (chapter 7, NCCL and cuDNN).
NCCL_GATES: tuple[tuple[tuple[int, int, int], str], ...] = (
    ((2, 27, 0), "shrink_group (ncclCommShrink)"),
    ((2, 28, 0), "reconfigure (ncclCommRevoke)"),
    ((2, 29, 0), "RMA windows (ncclCommWindowRegister)"),
    ((2, 29, 7), "communicator memory suspend/resume"),
)
RCCL_MIN = (2, 30, 7)
#: Legacy flight-recorder name -> its TORCH_FR_* name, from chapter 2's table of the settings (`pt215.flight`).
FR_LEGACY: dict[str, str] = {legacy: name for name, legacy, _, _ in ENV_VARS if legacy}


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def check_python(version: Sequence[int]) -> Check:
    """2.15 publishes wheels for CPython 3.11-3.15 (its `Requires-Python: >=3.11`); `version` as sys.version_info."""
    (lo, hi), text = PYTHONS, "Python " + ".".join(map(str, version))
    wanted = f"use Python {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"
    if tuple(version[:2]) < lo:
        return Check("python", "fail", f"{text}: torch 2.15 has no wheel for it", wanted, S_PY)
    if tuple(version[:2]) > hi:
        return Check("python", "warn", f"{text}: newer than the 3.15 wheels 2.15 ships", wanted, S_PY)
    return Check("python", "ok", f"{text} (2.15 wheels: 3.11-3.15)", section=S_PY)


def check_torch(version: str | None, error: str = "", installed: bool = False) -> Check:
    """The installed torch is 2.15.0, the release the book and its checklist describe. When `version` is None:
    `error`, what `import torch` raised (the cause goes on the line), and whether torch is `installed` all the same."""
    fix = f"pip install torch=={TORCH_WANTED} (in the book: bash scripts/install.sh)"
    if version is None:
        if installed and error:
            return Check("torch", "fail", f"installed but `import torch` fails: {error}",
                         f"reinstall it: pip install --force-reinstall torch=={TORCH_WANTED}", S_PY)
        return Check("torch", "fail", "not importable" + (f": {error}" if error else ""), fix, S_PY)
    if _v(version) == _v(TORCH_WANTED):
        return Check("torch", "ok", f"torch {version}", section=S_PY)
    if _v(version)[:2] == _v(TORCH_WANTED)[:2]:
        return Check("torch", "warn", f"torch {version}: the book was checked with {TORCH_WANTED}", fix, S_PY)
    return Check("torch", "fail", f"torch {version}; the book needs {TORCH_WANTED}", fix, S_PY)


def check_wheel(cuda: str | None, hip: str | None, mps_built: bool = False) -> Check:
    """Which wheel: CUDA 13.2 (the default on PyPI), CUDA 13.4, ROCm, macOS (MPS) or CPU (`torch.version.cuda` /
    `.hip`, `torch.backends.mps.is_built()`)."""
    if hip:
        return Check("wheel", "ok", f"ROCm {hip} wheel (the book's GPU cells are written for CUDA)", section=S_PY)
    if not cuda:
        what = "macOS wheel (MPS)" if mps_built else "CPU wheel (no CUDA, no ROCm)"
        return Check("wheel", "ok", what, section=S_PY)
    if cuda in WHEEL_CUDA:
        which = "the default" if cuda == WHEEL_CUDA[0] else "the alternative"
        return Check("wheel", "ok", f"CUDA {cuda} wheel ({which} 2.15 CUDA wheel)", section=S_PY)
    return Check("wheel", "warn", f"CUDA {cuda} wheel: not one of 2.15's CUDA 13.2 / 13.4 wheels",
                 "install the CUDA 13.2 (PyPI default) or 13.4 wheel", S_PY)


def check_driver(cuda: str | None, gpus: int, driver: str | None = None,
                 driver_cuda: tuple[int, int] | None = None) -> Check:
    """A CUDA 13.x wheel needs an NVIDIA driver of the 580 branch or newer (CUDA minor-version compatibility).

    `gpus`: the CUDA devices torch sees; `driver`: the driver's version (None: none found); `driver_cuda`: the
    newest CUDA it supports (libcuda; None: unknown), which tells a full match from minor-version compatibility.
    A driver too old for the wheel is a warning, not a failure: torch then sees no GPU and runs on the CPU."""
    if not cuda:
        return Check("driver", "skip", "not a CUDA wheel", section=S_PY)
    want = _v(cuda)[:2]
    branch = DRIVER_BRANCH.get(want[0])
    found = (f"NVIDIA driver {driver}" if driver else "the NVIDIA driver") + (
        f" (supports CUDA {driver_cuda[0]}.{driver_cuda[1]})" if driver_cuda else "")
    if (driver_cuda is not None and driver_cuda[0] < want[0]) or (
            driver is not None and branch is not None and _v(driver)[0] < branch):
        need = f"the {branch} branch" if branch else f"a driver for CUDA {want[0]}.x"
        return Check("driver", "warn", f"{found} is older than {need} CUDA {cuda} needs: torch sees no GPU",
                     f"upgrade the driver to {need} or newer", S_PY)
    if gpus == 0:
        return Check("driver", "skip", "no CUDA GPU here: the driver check does not apply", section=S_PY)
    if driver is None and driver_cuda is None:
        return Check("driver", "warn", "could not read the NVIDIA driver version",
                     "run nvidia-smi: CUDA 13.x needs driver >= 580", S_PY)
    if driver_cuda is not None and driver_cuda < want:
        return Check("driver", "warn", f"{found}: CUDA {cuda} runs through CUDA minor-version "
                     "compatibility (no PTX JIT)", f"update the driver to one that supports CUDA {cuda}", S_PY)
    needs = f" >= {branch}" if branch else f" CUDA {cuda}"
    return Check("driver", "ok", f"{found}; the CUDA {cuda} wheel needs{needs}", section=S_PY)


def check_nccl_backend(env: Mapping[str, str] | None, registered: str | None) -> Check:
    """What `init_process_group("nccl")` builds: read from the registry if "nccl" is registered in this
    process already (`registered`, its creator; the variable is read then, once), else predicted from
    TORCH_DIST_USE_NCCL2 in `env` (None: this process's environment)."""
    env = os.environ if env is None else env
    if registered is not None:
        legacy = registered == "_create_nccl_process_group"
        how = f"registered in this process ({registered})"
    else:
        legacy = env.get("TORCH_DIST_USE_NCCL2") == "0"
        how = "predicted from TORCH_DIST_USE_NCCL2=" + (repr(env["TORCH_DIST_USE_NCCL2"])
                                                        if "TORCH_DIST_USE_NCCL2" in env else "(unset)")
    if legacy:
        return Check("nccl backend", "warn", f"'nccl' builds the legacy ProcessGroupNCCL, {how}",
                     "unset TORCH_DIST_USE_NCCL2 after an A/B run on NCCL2", S_MIG)
    return Check("nccl backend", "ok", f"'nccl' builds ProcessGroupNCCL2, {how}", section=S_MIG)


def check_nccl_version(version: tuple[int, ...] | None, hip: str | None,
                       built: tuple[int, ...] | None = None) -> Check:
    """The NCCL library torch loads (`version`, what its `ncclGetVersion` says; None: none in this build), against
    the gates of 2.15's NCCL2 backend (NCCL_GATES) and the NCCL torch was built against (`built`,
    `torch.cuda.nccl.version()`, a compile-time constant); `hip`: the ROCm version of a ROCm build."""
    if hip:
        return Check("nccl version", "skip", "ROCm build: see the rccl check", section=S_MIG)
    if not version:
        return Check("nccl version", "skip", "no NCCL in this build", section=S_MIG)
    text = ".".join(map(str, version))
    if built and tuple(built[:3]) != tuple(version[:3]):
        return Check("nccl version", "warn", f"NCCL {text} loaded, but torch was built against "
                     f"{'.'.join(map(str, built[:3]))}: another libnccl.so.2 came first (LD_PRELOAD, a sys.path "
                     "folder with nvidia/nccl/lib, or a pip package that overwrote the wheel's)",
                     "find it: grep libnccl /proc/<pid>/maps; drop the pin or the path that brings it", S_MIG)
    missing = [what for need, what in NCCL_GATES if tuple(version) < need]
    if missing:
        return Check("nccl version", "warn", f"NCCL {text}: too old for " + ", ".join(missing),
                     "use NCCL >= 2.29.7 (the 2.15 wheels bundle 2.30.7)", S_MIG)
    return Check("nccl version", "ok", f"NCCL {text}: meets every NCCL2 gate (2.27 shrink, 2.28 reconfigure, "
                 "2.29 windows, 2.29.7 suspend)", section=S_MIG)


def check_rccl_version(hip: str | None, version: tuple[int, ...] | None) -> Check:
    """On ROCm (`hip`), reconfigure honours its timeout only with RCCL >= 2.30.7 (`nccl2/NcclApi.hpp`)."""
    if not hip:
        return Check("rccl version", "skip", "not a ROCm build", section=S_MIG)
    if not version:
        return Check("rccl version", "warn", "could not read the RCCL version", "pip show rocm", S_MIG)
    text = ".".join(map(str, version))
    if tuple(version) < RCCL_MIN:
        return Check("rccl version", "warn", f"RCCL {text} < 2.30.7: reconfigure cannot honour its timeout",
                     "install RCCL >= 2.30.7", S_MIG)
    return Check("rccl version", "ok", f"RCCL {text}", section=S_MIG)


def check_macos_mps(macos: str | None) -> Check:
    """MPS hosts need macOS 15 or newer for 2.15's MPS paths (`macos`: the version; None: not macOS). An older
    macOS is a warning, not a failure: torch runs there, on the CPU."""
    if not macos:
        return Check("macos", "skip", "not macOS", section=S_MPS)
    if _v(macos)[:1] < (15,):
        return Check("macos", "warn", f"macOS {macos}: 2.15's MPS paths (chapter 6's FP8 cells) need macOS >= 15",
                     "upgrade to macOS 15+", S_MPS)
    return Check("macos", "ok", f"macOS {macos}", section=S_MPS)


def check_fr_env(env: Mapping[str, str] | None = None) -> Check:
    """No legacy `TORCH_NCCL_*` flight-recorder names, and not the variable that never existed."""
    env = os.environ if env is None else env
    if "TORCH_NCCL_ENABLE_FLIGHT_RECORDER" in env:
        return Check("flight-recorder variables", "fail", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER is set: no such "
                     "variable, it does nothing", "unset it; the recorder is on when TORCH_FR_BUFFER_SIZE > 0",
                     S_FR)
    legacy = sorted(k for k in FR_LEGACY if k in env)
    if legacy:
        return Check("flight-recorder variables", "warn", "legacy names set: " + ", ".join(legacy),
                     "2.15 reads them with a deprecation warning; add " + ", ".join(
                         f"{FR_LEGACY[k]} (for {k})" for k in legacy) + ", and keep the legacy name while a job may "
                     "roll back to the legacy backend, which reads only it", S_FR)
    return Check("flight-recorder variables", "ok", "no legacy TORCH_NCCL_* recorder names set", section=S_FR)


def check_fr_buffer(env: Mapping[str, str] | None = None) -> Check:
    """The recorder is on (buffer size > 0): what post-mortems of a hang need."""
    env = os.environ if env is None else env
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if name in env:
            raw = env[name]
            break
    else:
        return Check("flight-recorder buffer", "ok", "default size 2000: recording", section=S_FR)
    try:
        size = int(raw)
    except ValueError:
        return Check("flight-recorder buffer", "warn", f"{name}={raw!r} is not an integer", "set an integer", S_FR)
    if size <= 0:
        return Check("flight-recorder buffer", "warn", f"{name}={size}: the recorder is off, a hang leaves no dump",
                     "unset it or set TORCH_FR_BUFFER_SIZE=2000", S_FR)
    return Check("flight-recorder buffer", "ok", f"{name}={size}: recording", section=S_FR)


def check_nccl2_env(env: Mapping[str, str] | None = None) -> Check:
    """TORCH_DIST_USE_NCCL2: unset is the goal; "0" is the rollback; any other value does nothing."""
    env = os.environ if env is None else env
    if "TORCH_DIST_USE_NCCL2" not in env:
        return Check("TORCH_DIST_USE_NCCL2", "ok", "unset", section=S_MIG)
    value = env["TORCH_DIST_USE_NCCL2"]
    if value == "0":
        return Check("TORCH_DIST_USE_NCCL2", "warn", "'0': the legacy ProcessGroupNCCL, 2.15's rollback switch",
                     "A/B on NCCL2, then unset it", S_MIG)
    return Check("TORCH_DIST_USE_NCCL2", "warn", f"{value!r}: no effect (only '0' selects the legacy backend)",
                 "unset it", S_MIG)


def check_target_version(env: Mapping[str, str] | None, abi: int | None) -> Check:
    """`-DTORCH_TARGET_VERSION=` in CFLAGS/CXXFLAGS must not exceed the headers' TORCH_ABI_VERSION (`abi`;
    None: unknown)."""
    env = os.environ if env is None else env
    flags = " ".join(env.get(k, "") for k in ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "NVCC_FLAGS", "TORCH_NVCC_FLAGS"))
    m = re.search(r"-DTORCH_TARGET_VERSION=(0[xX][0-9a-fA-F]+|\d+)", flags)
    headers = f"0x{abi:016x}" if abi is not None else "unknown"
    if not m:
        return Check("TORCH_TARGET_VERSION", "ok", f"not set in compiler flags (headers' TORCH_ABI_VERSION {headers})",
                     section=S_CPP)
    target = int(m.group(1), 0)
    if abi is not None and target > abi:
        return Check("TORCH_TARGET_VERSION", "fail", f"{m.group(1)} > headers' TORCH_ABI_VERSION {headers}: "
                     "a compile error", "lower it to <= the headers' version", S_CPP)
    return Check("TORCH_TARGET_VERSION", "ok", f"{m.group(1)} <= headers' {headers}", section=S_CPP)


def check_weights_only_env(env: Mapping[str, str] | None = None) -> Check:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns off the weights-only default of every torch.load."""
    env = os.environ if env is None else env
    if env.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true"):
        return Check("torch.load default", "warn", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: full unpickling",
                     "unset it; allow your classes with torch.serialization.add_safe_globals", S_LOAD)
    return Check("torch.load default", "ok", "weights_only=True by default", section=S_LOAD)


# ---------------------------------------------------------------- probes (this machine)


@dataclass
class Torch:
    """The installed torch as the checks see it; `version` None when `import torch` fails (`error` says why)."""

    version: str | None
    cuda: str | None = None
    hip: str | None = None
    mps_built: bool = False
    mps_available: bool = False
    nccl: str | None = None
    cudnn: str | None = None
    devices: tuple[tuple[str, str, float], ...] = ()  # (name, sm_NN, memory GiB) per CUDA device
    error: str = ""
    installed: bool = True  # False: no torch package at all (`error` is then ModuleNotFoundError's)


def probe_torch() -> Torch:
    """Import torch and describe it (`pt215.hardware.report`); a broken install gives `version` None and the error."""
    # Imported here, not at the top: the doctor must report a torch that fails to import (hardware imports it).
    try:
        import torch

        from pt215 import hardware
    except Exception as e:  # noqa: BLE001 - a broken install raises OSError, AttributeError, ... as well
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        return Torch(None, error=error, installed=not (isinstance(e, ModuleNotFoundError) and e.name == "torch"))
    hw = hardware.report()
    return Torch(
        version=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
        mps_built=hw.mps_built, mps_available=hw.mps_available, nccl=hw.nccl, cudnn=hw.cudnn,
        devices=tuple((d.name, d.sm, d.memory_gib) for d in hw.cuda_devices),
    )


def probe_driver() -> tuple[tuple[int, int] | None, str | None]:
    """(CUDA version the driver supports, driver version) from `pt215.hardware`; (None, None) without a driver."""
    try:
        from pt215 import hardware  # imports torch: see probe_torch
    except Exception:  # noqa: BLE001 - no torch, no CUDA wheel to check a driver against
        return None, None
    return hardware.driver_cuda_version(), hardware.driver_version()


def probe_nccl() -> tuple[int, ...] | None:
    """The NCCL (or RCCL) version torch was built against, from `pt215.hardware` (`torch.cuda.nccl.version()`
    returns the compile-time NCCL_VERSION_CODE, not the library loaded); None without one."""
    try:
        from pt215 import hardware  # imports torch: see probe_torch
    except Exception:  # noqa: BLE001
        return None
    return hardware.nccl_version()


def nccl_code_version(code: int) -> tuple[int, int, int]:
    """An `ncclGetVersion` code as (major, minor, patch): 23007 -> (2, 30, 7); codes before 2.9 are 2708 -> 2.7.8."""
    if code >= 10000:
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


def probe_nccl_loaded() -> tuple[int, ...] | None:
    """The version of the libnccl.so.2 this process bound after `import torch`: the already loaded library's own
    `ncclGetVersion` (dlopen by soname with RTLD_NOLOAD returns the first one loaded, the one torch's imports were
    bound to; nothing is loaded anew). None where no libnccl.so.2 is loaded (not Linux, a CPU or ROCm build)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        import torch  # noqa: F401 - loads libtorch_cuda.so and the NCCL it binds
        lib = ctypes.CDLL("libnccl.so.2", mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_LOCAL)
        code = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(code)) != 0 or code.value <= 0:
            return None
    except Exception:  # noqa: BLE001 - no such library loaded, or no such symbol
        return None
    return nccl_code_version(code.value)


def probe_nccl_backend() -> str | None:
    """The creator function "nccl" is registered with in this process, or None where none is registered yet."""
    try:
        from torch.distributed import Backend  # see probe_torch

        plugin = Backend._plugins.get("NCCL")
    except Exception:  # noqa: BLE001 - no distributed support: the check predicts from the variable
        return None
    return plugin.creator_fn.__name__ if plugin is not None else None


def probe_macos() -> str | None:
    """This Mac's macOS version, or None on another system."""
    return platform.mac_ver()[0] or None


def probe_headers_abi() -> int | None:
    """TORCH_ABI_VERSION of the installed torch's C++ headers (`torch/headeronly/version.h`), or None."""
    try:
        import torch  # see probe_torch
    except Exception:  # noqa: BLE001
        return None
    h = Path(torch.__file__).parent / "include" / "torch" / "headeronly" / "version.h"
    try:
        text = h.read_text()
    except OSError:
        return None
    parts = {k: int(v) for k, v in re.findall(r"#define TORCH_VERSION_(MAJOR|MINOR|PATCH|ABI_TAG) (\d+)", text)}
    if len(parts) != 4:
        return None
    return (parts["MAJOR"] << 56) | (parts["MINOR"] << 48) | (parts["PATCH"] << 40) | parts["ABI_TAG"]


def environment_checks(env: Mapping[str, str] | None = None) -> list[Check]:
    """Every environment item of the chapter 7 checklist, checked on this machine (`env`: a job's variables,
    None for this process's)."""
    t = probe_torch()
    driver_cuda, driver = probe_driver() if t.cuda else (None, None)
    nccl = probe_nccl()
    loaded = probe_nccl_loaded() if not t.hip else None
    return [
        check_python(sys.version_info[:3]),
        check_torch(t.version, t.error, t.installed),
        check_wheel(t.cuda, t.hip, t.mps_built),
        check_driver(t.cuda, len(t.devices), driver, driver_cuda),
        check_nccl_backend(env, probe_nccl_backend()),
        check_nccl_version(loaded or nccl, t.hip, nccl if loaded else None),
        check_rccl_version(t.hip, nccl),
        check_macos_mps(probe_macos()),
        check_nccl2_env(env),
        check_fr_env(env),
        check_fr_buffer(env),
        check_target_version(env, probe_headers_abi()),
        check_weights_only_env(env),
    ]
