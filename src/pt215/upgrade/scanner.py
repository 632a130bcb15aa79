"""The walk and the scan of `python -m pt215.upgrade` (chapter 7): which files, read how, which findings.

The package docstring (`pt215.upgrade`) says what the scanner is; `pt215.upgrade.cli` is its command line.
"""

from __future__ import annotations

import io
import json
import os
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pt215.upgrade.ci import _PROJECT_CACHE, CI_FILES, CI_FOLDERS, ci_kind, project_for, scan_ci
from pt215.upgrade.config import Settings, noqa_lines
from pt215.upgrade.output import safe
from pt215.upgrade.python import scan_python
from pt215.upgrade.rules import ACC_POLICIES, FR_LEGACY, RULES, Finding, Rule, finding
from pt215.upgrade.text import admits, below_215, has_trigger, recipe_pin, scan_patterns

__all__ = ["RULES", "Rule", "Finding", "ScanError", "FR_LEGACY", "ACC_POLICIES", "Report", "scan_text",
           "scan_file", "scan_paths", "scan", "iter_files", "kind_of", "admits"]

SKIP_DIRS = {".venv", "venv", "_build", "build", "node_modules", "__pycache__", "site-packages"}
#: Hidden folders that hold CI or container definitions (GitHub, GitLab, CircleCI, Buildkite, Lightning, Azure,
#: Jenkins, devcontainers, ...): entered by the walk; every other hidden folder is skipped.
HIDDEN_OK = CI_FOLDERS
SHELL_SUFFIXES = {".sh", ".bash", ".zsh", ".ksh", ".slurm", ".sbatch", ".env"}
KINDS = {".py": "python", ".pyi": "python", ".ipynb": "notebook", ".yaml": "yaml", ".yml": "yaml",
         ".toml": "toml", ".ini": "ini", ".cfg": "ini", ".json": "json", ".cmake": "cmake", ".mk": "make",
         **{s: "shell" for s in SHELL_SUFFIXES}}
MAX_BYTES = 5_000_000


class ScanError(Exception):
    """Bad input: a path that does not exist or is not a regular file or directory. The message names it."""


@dataclass
class _File:
    path: str
    text: str
    kind: str
    encoding: str | None
    rel: str = ""  # the path inside the folder that was scanned (what a recipe's folder name is read from)
    findings: list[Finding] = field(default_factory=list)
    pins: list[tuple[int, str]] = field(default_factory=list)
    uses: list[tuple[int, str]] = field(default_factory=list)
    edits: list = field(default_factory=list)


@dataclass
class Report:
    """A scan: findings (sorted by path and line), files scanned, notes, and each file's text and fixes."""

    findings: list[Finding]
    n_files: int
    notes: list[str]
    files: list[_File]
    internal_errors: int = 0


def kind_of(path: Path) -> str | None:
    """The scanner's name for a file's kind, or None for files a directory walk ignores."""
    name = path.name
    low = name.lower()
    if low in ("dockerfile", "containerfile") or low.endswith(".dockerfile") or low.startswith(
            ("dockerfile.", "dockerfile-", "containerfile.")):
        return "dockerfile"
    if low.endswith((".txt", ".in")) and ("requirements" in low or "constraints" in low):
        return "requirements"
    if low == "cmakelists.txt":
        return "cmake"
    if low in ("makefile", "gnumakefile"):
        return "make"
    if low in CI_FILES or low.startswith(".readthedocs."):
        return "yaml"
    return KINDS.get(path.suffix.lower())


def _is_ci(path: Path) -> bool:
    return ci_kind(str(path)) is not None


def iter_files(paths: Sequence[str | Path], *, exclude: Iterable[str] = (),
               settings: Settings | None = None) -> list[Path]:
    """The files a scan of `paths` reads, each once: named files always, directories walked (skipping
    SKIP_DIRS, `exclude`, the settings' excludes and hidden directories other than CI folders). Raises
    ScanError for a path that does not exist."""
    skip = SKIP_DIRS | set(exclude)
    settings = settings or Settings()
    out: list[Path] = []
    seen: set[str] = set()

    def keep(f: Path) -> None:
        try:
            key = os.path.realpath(f)
        except (OSError, ValueError):
            key = str(f)
        if key not in seen:
            seen.add(key)
            out.append(f)

    for p in map(Path, paths):
        if p.is_file():
            keep(p)
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                rel_root = Path(root).relative_to(p)
                dirs[:] = sorted(d for d in dirs if d not in skip and (not d.startswith(".") or d in HIDDEN_OK)
                                 and not settings.excluded(str(rel_root / d)))
                for name in sorted(files):
                    f = Path(root) / name
                    if kind_of(f) and not settings.excluded(str(rel_root / name)) and f.is_file():
                        keep(f)
        elif p.exists():
            raise ScanError(f"{safe(str(p))}: not a regular file or directory")
        else:
            raise ScanError(f"{safe(str(p))}: no such file or directory")
    return out


def _read(path: Path, kind: str) -> tuple[str | None, str | None, str | None]:
    """(text, encoding, note): PEP 263 coding lines and BOMs honoured; an undecodable file is read as
    Latin-1 with a note; an unreadable, binary or huge file is skipped with a note."""
    shown = safe(str(path))
    try:
        data = path.read_bytes()
    except OSError as e:
        return None, None, f"{shown}: cannot read ({e.strerror or e}); skipped"
    if len(data) > MAX_BYTES:
        return None, None, f"{shown}: larger than {MAX_BYTES // 1_000_000} MB; skipped"
    if b"\0" in data[:8192]:
        return None, None, f"{shown}: binary (NUL bytes); skipped"
    enc = "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"  # --fix writes back what it read
    if kind == "python":
        try:
            enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:  # not UTF-8 and no coding line: the decode below names the byte
            enc = "utf-8"
    try:
        return data.decode(enc), enc, None
    except (UnicodeDecodeError, LookupError) as e:
        where = f" (byte 0x{data[e.start]:02x} at offset {e.start})" if isinstance(e, UnicodeDecodeError) else ""
        name = enc.replace("-sig", "").upper()
        return data.decode("latin-1"), None, f"{shown}: not {name} text{where}; read as Latin-1"


def _scan_cells(text: str, path: str, out: _File, notes: list[str]) -> None:
    try:
        cells = json.loads(text).get("cells", [])
        assert isinstance(cells, list)
    except (ValueError, AttributeError, AssertionError, RecursionError):
        notes.append(f"{safe(path)}: not a notebook (no JSON cells); skipped")
        return
    for i, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        lines = src.splitlines()
        shell_cell = bool(lines) and lines[0].lstrip().startswith("%%") and not lines[0].strip().startswith(
            "%%time")
        py = ["" if shell_cell or ln.lstrip().startswith(("!", "%")) else ln for ln in lines]
        sh = [ln if shell_cell or ln.lstrip().startswith(("!", "%")) else "" for ln in lines]
        part = _File(path, "\n".join(py), "python", None, rel=out.rel)
        _scan_python_or_patterns(part, notes, cell=i)
        shell = scan_patterns("\n".join(sh), path, "shell")
        quiet = noqa_lines(src)
        for f in part.findings + shell.findings:
            if not _silenced(quiet, f):
                out.findings.append(replace(f, cell=i))
        out.pins += shell.pins + part.pins
        out.uses += part.uses


def _scan_python_or_patterns(f: _File, notes: list[str], cell: int | None = None) -> None:
    if not has_trigger(f.text):
        return  # nothing any rule looks for: not even parsed
    where = f"{safe(f.path)}" + (f":cell {cell}" if cell is not None else "")
    try:
        res = scan_python(f.text, f.path, f.rel or None)
    except SyntaxError as e:
        notes.append(f"{where}:{e.lineno or 0}: not valid Python ({e.msg}); scanned by pattern only")
    except (RecursionError, MemoryError, ValueError) as e:
        notes.append(f"{where}: the parser gave up ({type(e).__name__}); scanned by pattern only")
    else:
        f.findings += res.findings
        f.pins += res.pins
        f.uses += res.uses
        f.edits += res.edits
        return
    res2 = scan_patterns(f.text, f.path, "shell")
    f.findings += res2.findings
    f.pins += res2.pins


def _silenced(quiet: dict[int, set[str] | None], f: Finding) -> bool:
    if f.line not in quiet:
        return False
    codes = quiet[f.line]
    return codes is None or f.code in codes


def _scan_file(f: _File, notes: list[str], ci: bool = False, on_disk: bool = False) -> None:
    if f.kind == "notebook":
        _scan_cells(f.text, f.path, f, notes)
    elif f.kind == "python":
        _scan_python_or_patterns(f, notes)
    else:
        ci_found = scan_ci(f.text, f.path, project_for(Path(f.path)) if on_disk else None) if ci else None
        res = scan_patterns(f.text, f.path, f.kind, ci=ci_found is not None)
        f.findings += res.findings + (ci_found or [])
        f.pins += res.pins
        f.edits += res.edits
        f.findings += _cxx_standard(f, on_disk)
    if f.kind != "notebook":
        quiet = noqa_lines(f.text)
        f.findings = [x for x in f.findings if not _silenced(quiet, x)]
    pin = recipe_pin(f.rel or f.path)
    if pin:
        f.findings = [_as_recipe(x, pin) for x in f.findings]
    f.findings = list(dict.fromkeys(f.findings))  # one per line, code and message


_RECIPE_CODES = {"PT1508", "PT1512", "PT1513", "PT1518"}


def _as_recipe(x: Finding, pin: str) -> Finding:
    """A CUDA 12, Python 3.10 or system NCCL/cuDNN pin inside a recipe whose path names an older stack: true,
    nothing to do."""
    if x.code not in _RECIPE_CODES:
        return x
    return replace(finding(x.path, x.line, "PT1519", what=f"{x.message} (inside a recipe for {pin})", pin=pin),
                   cell=x.cell)


#: Torch's headers or libraries named in a build file: what makes its C++ standard matter.
TORCH_BUILD_RE = re.compile(r"torch/(?:extension|library|all|script|torch)\.h|ATen/|find_package\s*\(\s*Torch\b|"
                            r"torch\.utils\.cpp_extension|cpp_extension|libtorch|-ltorch\b|torch/include|"
                            r"TORCH_INCLUDE|Torch_DIR|TORCH_LIBRARIES|include_paths\(\)")
TORCH_INCLUDE_RE = re.compile(r"^\s*#\s*include\s*[<\"](?:torch|ATen|c10)/", re.MULTILINE)
SOURCE_SUFFIXES = {".cpp", ".cc", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".c++"}


def _sources_include_torch(folder: Path) -> bool:
    """Do the C++/CUDA sources next to a build file include torch's headers? (at most 64 files, 64 KB each)"""
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in SOURCE_SUFFIXES and p.is_file())[:64]
    except OSError:
        return False
    for src in files:
        try:
            with open(src, "rb") as fh:
                head = fh.read(65536).decode("utf-8", "replace")
        except OSError:
            continue
        if TORCH_INCLUDE_RE.search(head):
            return True
    return False


def _cxx_standard(f: _File, on_disk: bool) -> list[Finding]:
    """PT1516: a C++ standard below C++20 in a build file (CMake, a Makefile, a shell compile line) that compiles
    torch's headers: the file names them (torch/extension.h, find_package(Torch), cpp_extension, libtorch) or the
    sources next to it include them. In Python, `pt215.upgrade.python` reads cpp_extension's arguments instead."""
    from pt215.native import cxx_standard_problems

    low = f.text.lower()
    if "c++" not in low and "cxx_std" not in low and "cxx_standard" not in low:
        return []
    problems = cxx_standard_problems(f.text)  # CMake settings raised by find_package(Torch) are not problems
    if not problems:
        return []
    if not TORCH_BUILD_RE.search(f.text) and not (on_disk and _sources_include_torch(Path(f.path).parent)):
        return []  # no torch header is compiled with this standard (a pybind11 helper, a CuPy kernel)
    out = []
    for problem in problems:
        where, what = problem.split(": ", 1)
        out.append(finding(f.path, int(where.removeprefix("line ")), "PT1516", what=what.split(" (torch")[0],
                           fix="this standard reaches a compile of torch's headers: build as C++20 (-std=c++20, "
                               "CMAKE_CXX_STANDARD 20, cxx_std_20)"))
    return out


def _resolve_pins(files: Sequence[_File]) -> list[Finding]:
    uses = [(f.path, line, api) for f in files for line, api in f.uses]
    if not uses:
        return []
    p0, l0, api = uses[0]
    out = []
    for f in files:
        if recipe_pin(f.rel or f.path):
            continue  # a recipe for an older stack pins that stack's torch on purpose
        quiet = noqa_lines(f.text) if f.kind != "notebook" else {}
        for line, spec in f.pins:
            if below_215(spec):
                x = finding(f.path, line, "PT1509", spec=f"torch{spec}", use=f"{p0}:{l0}", api=api)
                if not _silenced(quiet, x):
                    out.append(x)
    return out


def _rel(path: Path, settings: Settings) -> str:
    if settings.config is not None:
        try:
            return Path(os.path.abspath(path)).relative_to(settings.config.parent.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def scan(paths: Sequence[str | Path], *, exclude: Iterable[str] = (), settings: Settings | None = None) -> Report:
    """Scan files and directories (read-only). Raises ScanError only for a path that does not exist; a file
    that cannot be read or parsed becomes a note."""
    settings = settings or Settings()
    files = iter_files(paths, exclude=exclude, settings=settings)
    _PROJECT_CACHE.clear()  # a repository's metadata is read once per scan, and again by the next one
    notes: list[str] = []
    scanned: list[_File] = []
    internal = 0
    roots = [Path(x) for x in paths if Path(x).is_dir()]
    for p in files:
        kind = kind_of(p) or "shell"
        text, enc, note = _read(p, kind)
        if note:
            notes.append(note)
        if text is None:
            continue
        f = _File(str(p), text, kind, enc, rel=_inside(p, roots))
        try:
            _scan_file(f, notes, ci=_is_ci(Path(f.rel)), on_disk=True)
        except Exception as e:  # noqa: BLE001 - one pathological file is a note, the scan goes on
            notes.append(f"{safe(str(p))}: internal error while scanning ({type(e).__name__}: {e}); skipped")
            f.findings, f.pins, f.uses, f.edits = [], [], [], []
            internal += 1
        scanned.append(f)
    found = [x for f in scanned for x in f.findings] + _resolve_pins(scanned)
    codes = {str(p): settings.codes_for(_rel(p, settings)) for p in files}
    found = [x for x in found if x.code in codes.get(x.path, settings.codes())]
    found.sort(key=lambda x: (x.path, x.cell or 0, x.line, x.code))
    return Report(found, len(files), notes, scanned, internal)


def _inside(p: Path, roots: list[Path]) -> str:
    """`p` relative to the scanned folder that holds it (its name alone for a file named on the command line)."""
    for root in roots:
        try:
            return p.relative_to(root).as_posix()
        except ValueError:
            continue
    return p.name


def scan_paths(paths: Sequence[str | Path], *, exclude: Iterable[str] = (), settings: Settings | None = None
               ) -> tuple[list[Finding], int, list[str]]:
    """Scan files and directories; returns (findings sorted by path and line, files scanned, notes)."""
    r = scan(paths, exclude=exclude, settings=settings)
    return r.findings, r.n_files, r.notes


def scan_file(path: str | Path) -> list[Finding]:
    """Scan one file (read-only)."""
    return scan_paths([path])[0]


def scan_text(text: str, path: str = "<text>", kind: str | None = None) -> list[Finding]:
    """Scan one file's text; `kind` (python, notebook, shell, dockerfile, yaml, toml, ini, json, requirements)
    defaults from `path`'s name, and to shell-style patterns when the name says nothing."""
    p = Path(path)
    f = _File(path, text, kind or kind_of(p) or "shell", "utf-8", rel=path)
    _scan_file(f, [], ci=_is_ci(p))
    return sorted(f.findings + _resolve_pins([f]), key=lambda x: (x.cell or 0, x.line, x.code))
