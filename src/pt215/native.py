"""Native code against torch 2.15: the C++ standard in build files, TORCH_TARGET_VERSION, header checks (chapter 9).

`cxx_standard_problems(text)` finds C++ standards older than C++20 in a build file (CMakeLists.txt, setup.py,
a Makefile or a compile command): 2.15's headers need C++20; `torch.utils.cpp_extension` passes `-std=c++20`
unless the build gives its own `-std`. `torch_target_version(2, 10)` is the value of `TORCH_TARGET_VERSION`
that targets a release's stable ABI. `syntax_check(code, ...)` runs the C++ compiler on a snippet against the
installed torch headers and returns its error lines with the machine's paths removed; `include_chain(start,
target)` says through which `#include` lines one torch header reaches another.
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
           "CompileCheck", "syntax_check", "include_chain", "gil_after_extension"]

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
_CMAKE_SETTING = ("CMAKE_CXX_STANDARD", "CXX_STANDARD", "target_compile_features")
#: CMake places that carry C++ flags to a target's compile line *before* its compile features' own -std flag.
_CMAKE_CXX_FLAGS = re.compile(r"CMAKE_CXX_FLAGS|add_compile_options|target_compile_options|add_definitions|"
                              r"COMPILE_OPTIONS|COMPILE_FLAGS", re.IGNORECASE)


def cxx_standard_problems(build_file_text: str) -> list[str]:
    """Each place in a build file that selects a C++ standard older than C++20, as 'line N: ... (needs C++20)'.

    In CMake a compile feature raises the standard: `find_package(Torch)` gives the `torch` target
    `INTERFACE cxx_std_20` (TorchConfig.cmake), and a `cxx_std_20` (or newer) feature does the same. CMake puts
    the feature's flag (`-std=gnu++20`) on the compile line *after* the flags of `CMAKE_CXX_FLAGS`,
    `add_compile_options` and `target_compile_options`, and the last `-std` wins, so in such a file neither a
    lower `CMAKE_CXX_STANDARD`/`CXX_STANDARD`/`cxx_std_17` nor a `-std=c++17` in those flags is reported
    (`tests/upgrade/test_cxx_standard.py` builds it). A `-std` flag anywhere else (a Makefile, a `setup.py`, a
    compile command, CMake's CUDA flags) is reported.
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
                if year is None or year >= MIN_CXX_STANDARD:
                    continue
                if raised and (text.startswith(_CMAKE_SETTING) or (
                        _CMAKE_CXX_FLAGS.search(code) and "CUDA" not in code.upper())):
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
    """Result of `syntax_check`: did it compile, the compiler's first error, and every error line it printed
    (`file:line:col: error: ...`, paths relative to torch's include directory, the snippet as `check.cpp`)."""

    ok: bool
    first_error: str
    errors: tuple[str, ...] = ()

    def where(self) -> str:
        """`file:line` of the first error ('' when it compiled): the part that does not depend on the compiler."""
        m = _LOCATION.match(self.first_error)
        return f"{m.group('file')}:{m.group('line')}" if m else ""


_LOCATION = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+)(?::\d+)?: (?:fatal )?error: ")


def _is_clang(compiler: str) -> bool:
    proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return "clang" in proc.stdout.lower()


def syntax_check(code: str, *, std: str = "c++20", defines: Sequence[str] = (), compiler: str | None = None,
                 max_errors: int | None = None, timeout_s: float = 120.0) -> CompileCheck:
    """Compile `code` with `-fsyntax-only -std=<std>` against the torch headers (both of `cpp_extension`'s include
    directories); no object is written. `max_errors` stops the compiler after that many errors (1: at the first,
    which keeps a failing compile of a large header short)."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError("syntax_check(): code must be C++ source text")
    if not re.fullmatch(r"(?:c|gnu)\+\+\w\w", std):
        raise ValueError(f"syntax_check(): std must look like 'c++20' or 'gnu++17', got {std!r}")
    if max_errors is not None and (isinstance(max_errors, bool) or not isinstance(max_errors, int) or max_errors < 1):
        raise ValueError(f"syntax_check(): max_errors must be a positive int or None, got {max_errors!r}")
    compiler = compiler or os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("syntax_check(): no C++ compiler found (install g++ or set CXX)")
    from torch.utils.cpp_extension import include_paths

    include = torch_include_dir()
    if max_errors is None:
        limit = []
    elif max_errors == 1:
        limit = ["-Wfatal-errors"]  # stops at once, even at an #error (gcc's -fmax-errors=1 parses on)
    else:
        limit = [f"-ferror-limit={max_errors}" if _is_clang(compiler) else f"-fmax-errors={max_errors}"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "check.cpp")
        with open(src, "w") as f:
            f.write(code)
        cmd = [compiler, "-fsyntax-only", f"-std={std}", *limit, *[a for d in include_paths() for a in ("-I", d)],
               *[f"-D{d}" for d in defines], src]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line.replace(include + os.sep, "").replace(src, "check.cpp") for line in proc.stderr.splitlines()]
    errors = tuple(line.strip() for line in lines if _LOCATION.match(line.strip()))
    first = re.sub(r"^check\.cpp:\d+:\d+: ", "check.cpp: ", errors[0]) if errors else ""
    return CompileCheck(proc.returncode == 0, first, errors)


def include_chain(start: str, target: str, *, include_dir: str | None = None) -> list[str]:
    """The shortest chain of `#include <...>` lines that leads from header `start` to header `target` in the
    installed torch headers (both relative to the include directory), e.g. why `torch/library.h` needs
    `c10/util/Bitset.h`. Read from the header text, so it follows every `#include`, conditional or not."""
    from collections import deque
    from pathlib import Path

    from torch.utils.cpp_extension import include_paths

    roots = [Path(include_dir)] if include_dir is not None else [Path(p) for p in include_paths()]

    def find(name: str) -> Path | None:
        return next((root / name for root in roots if (root / name).is_file()), None)

    if find(start) is None or find(target) is None:
        raise ValueError(f"include_chain(): {start if find(start) is None else target!r} is not a torch header")
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        name = queue.popleft()
        if name == target:
            chain = [name]
            while parent[chain[-1]] is not None:
                chain.append(parent[chain[-1]])  # type: ignore[arg-type]
            return chain[::-1]
        path = find(name)
        if path is None:
            continue
        for included in re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', path.read_text(errors="ignore"), re.M):
            if included not in parent and find(included) is not None:
                parent[included] = name
                queue.append(included)
    return []


_GIL_SOURCE = "int add_one(int x) { return x + 1; }"


def gil_after_extension(build_directory: str) -> dict[str, object]:
    """On a free-threaded Python (3.14t: the free-threaded torch 2.15 wheels are cp314t): whether the GIL is
    enabled after importing torch, and after loading a `load_inline(..., gil_not_used=True)` module built in
    `build_directory`; with the module's result.

    A module that does not declare `gil_not_used` makes CPython re-enable the GIL when it is imported (chapter 9,
    notebook 9.1; `python -m pt215.verify --only ch9.free-threaded`).
    """
    import sys
    import sysconfig

    if sysconfig.get_config_var("Py_GIL_DISABLED") != 1:
        raise RuntimeError("gil_after_extension needs a free-threaded Python (3.14t); this one has the GIL")
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

