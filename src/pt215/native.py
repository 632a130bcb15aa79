"""Native code against torch 2.15: the C++ standard in build files, TORCH_TARGET_VERSION, header checks (chapter 9).

`cxx_standard_problems(text)` finds C++ standards older than C++20 in a build file (CMakeLists.txt, setup.py,
a Makefile or a compile command): 2.15's headers need C++20 and `torch.utils.cpp_extension` passes
`-std=c++20`. `torch_target_version(2, 10)` is the value of `TORCH_TARGET_VERSION` that targets a release's
stable ABI. `syntax_check(code, ...)` runs the C++ compiler on a snippet against the installed torch headers
and returns its first error with the machine's paths removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_CXX_STANDARD", "cxx_standard_problems", "torch_target_version", "torch_include_dir",
           "CompileCheck", "syntax_check", "gil_after_extension"]

MIN_CXX_STANDARD = 20
"""The C++ standard torch 2.15's headers and `torch.utils.cpp_extension` require."""

# (pattern, what it is); group "std" is the standard's number (98 -> 1998, read as older than everything).
_STANDARD_PATTERNS = [
    (re.compile(r"-std=(?:c|gnu)\+\+(?P<std>\d\w)"), "{flag} flag"),
    (re.compile(r"/std:c\+\+(?P<std>\d\d)"), "MSVC {flag} flag"),
    (re.compile(r"CMAKE_CXX_STANDARD\s+\"?(?P<std>\d\d)"), "CMAKE_CXX_STANDARD {std}"),
    (re.compile(r"\bCXX_STANDARD\s+\"?(?P<std>\d\d)"), "CXX_STANDARD {std} target property"),
    (re.compile(r"\bcxx_std_(?P<std>\d\d)\b"), "target_compile_features cxx_std_{std}"),
]
_DRAFT_NAMES = {"0x": 11, "1y": 14, "1z": 17, "2a": 20, "2b": 23, "2c": 26}


def _standard_year(text: str) -> int | None:
    if text in _DRAFT_NAMES:
        return _DRAFT_NAMES[text]
    if text.isdigit():
        value = int(text)
        return value - 100 if value >= 90 else value  # 98 -> -2: older than 11
    return None


_RAISED_BY = re.compile(r"find_package\s*\(\s*Torch\b|\bcxx_std_(?:2\d)\b", re.IGNORECASE)
_CMAKE_SETTING = ("CMAKE_CXX_STANDARD", "CXX_STANDARD target property", "cxx_std_")


def cxx_standard_problems(build_file_text: str) -> list[str]:
    """Each place in a build file that selects a C++ standard older than C++20, as 'line N: ... (needs C++20)'.

    In CMake a compile feature raises the standard: `find_package(Torch)` gives the `torch` target
    `INTERFACE cxx_std_20` (TorchConfig.cmake), and a `cxx_std_20` (or newer) feature does the same, so a lower
    `CMAKE_CXX_STANDARD`, `CXX_STANDARD` or `cxx_std_17` in such a file is not reported. An explicit `-std=` flag
    still wins over both and is always reported.
    """
    if not isinstance(build_file_text, str):
        raise ValueError(f"build_file_text must be the build file's text (str), got {type(build_file_text).__name__}")
    code_lines = [line.split("#", 1)[0] if not line.lstrip().startswith("//") else ""
                  for line in build_file_text.splitlines()]
    raised = any(_RAISED_BY.search(code) for code in code_lines)
    problems = []
    for number, code in enumerate(code_lines, start=1):
        for pattern, what in _STANDARD_PATTERNS:
            for match in pattern.finditer(code):
                year = _standard_year(match.group("std"))
                text = what.format(std=match.group("std"), flag=match.group(0))
                if year is None or year >= MIN_CXX_STANDARD or (raised and text.startswith(_CMAKE_SETTING)):
                    continue
                problems.append(f"line {number}: {text} (torch 2.15 needs C++{MIN_CXX_STANDARD})")
    return problems


def torch_target_version(major: int, minor: int, patch: int = 0) -> str:
    """The `TORCH_TARGET_VERSION` value for a release, as torch/headeronly/version.h packs it (hex literal)."""
    for name, value in (("major", major), ("minor", minor), ("patch", patch)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"torch_target_version(): {name} must be an integer 0-255, got {value!r}")
    return f"0x{(major << 56) | (minor << 48) | (patch << 40):016X}"


def torch_include_dir() -> str:
    """The installed torch's C++ include directory."""
    from torch.utils.cpp_extension import include_paths

    return include_paths()[0]


@dataclass(frozen=True)
class CompileCheck:
    """Result of `syntax_check`: did it compile, and the compiler's first error (paths made relative)."""

    ok: bool
    first_error: str


def syntax_check(code: str, *, std: str = "c++20", defines: Sequence[str] = (), compiler: str | None = None,
                 timeout_s: float = 120.0) -> CompileCheck:
    """Compile `code` with `-fsyntax-only -std=<std>` against the torch headers; no object is written."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError("syntax_check(): code must be C++ source text")
    if not re.fullmatch(r"(?:c|gnu)\+\+\w\w", std):
        raise ValueError(f"syntax_check(): std must look like 'c++20' or 'gnu++17', got {std!r}")
    compiler = compiler or os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("syntax_check(): no C++ compiler found (install g++ or set CXX)")
    include = torch_include_dir()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "check.cpp")
        with open(src, "w") as f:
            f.write(code)
        cmd = [compiler, "-fsyntax-only", f"-std={std}", "-I", include, *[f"-D{d}" for d in defines], src]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    first = errors[0] if errors else ""
    first = first.replace(include + os.sep, "").replace(src, "check.cpp")
    first = re.sub(r"^check\.cpp:\d+:\d+: ", "check.cpp: ", first)
    return CompileCheck(proc.returncode == 0, first.strip())


_GIL_SOURCE = "int add_one(int x) { return x + 1; }"


def gil_after_extension(build_directory: str) -> dict[str, object]:
    """On a free-threaded Python (3.13t or later): whether the GIL is enabled after importing torch, and after
    loading a `load_inline(..., gil_not_used=True)` module built in `build_directory`; with the module's result.

    A module that does not declare `gil_not_used` makes CPython re-enable the GIL when it is imported (chapter 9,
    notebook 1; `python -m pt215.verify --only ch9.free-threaded`).
    """
    import sys
    import sysconfig

    if sysconfig.get_config_var("Py_GIL_DISABLED") != 1:
        raise RuntimeError("gil_after_extension needs a free-threaded Python (3.13t or later); this one has the GIL")
    if not isinstance(build_directory, str) or not os.path.isdir(build_directory):
        raise ValueError(f"build_directory must be an existing folder, got {build_directory!r}")
    import torch  # noqa: F401 - importing torch is the first thing measured
    from torch.utils import cpp_extension

    after_torch = sys._is_gil_enabled()  # type: ignore[attr-defined] - 3.13+
    module = cpp_extension.load_inline(name="pt215_gil_free", cpp_sources=[_GIL_SOURCE], functions=["add_one"],
                                       gil_not_used=True, build_directory=build_directory, verbose=False)
    return {"GIL after import torch": after_torch,
            "GIL after the gil_not_used extension": sys._is_gil_enabled(),  # type: ignore[attr-defined]
            "add_one(41)": module.add_one(41)}

