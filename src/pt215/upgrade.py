"""`python -m pt215.upgrade PATH...`: find what PyTorch 2.15 changes in a team's code and configs (chapter 7).

A linter for one upgrade, with the conventions of ruff and flake8. It reads Python and notebook cells with
the `ast` module, names resolved by import origin (only what comes from torch counts), and shell scripts,
Dockerfiles, CI workflows (`.github/`, `.gitlab-ci.yml`), YAML, TOML, INI/`setup.cfg`, JSON and requirements
files by pattern. It prints one finding per line, `path:line: CODE [severity] message: fix (book: section)`.

Exit status: 0 when nothing at `error` or `warning` severity was found (`info` findings never fail a run),
1 when something was, 2 on a usage error (a missing path, an unknown code, a bad `[tool.pt215.upgrade]` table)
or an internal error. A file that cannot be read or parsed is a note on stderr and the scan goes on.

Codes (stable): one table, `pt215.upgrade_rules.RULES`; `--explain CODE` prints one, chapter 7 explains each.

Directories are walked recursively; `.venv`, `venv`, `_build`, `build`, `node_modules`, `__pycache__`,
`site-packages` and hidden directories other than `.github`, `.gitlab`, `.circleci`, `.buildkite` are skipped
unless named on the command line. `# noqa` silences every code on its line, `# noqa: PT1505` that code.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pt215.upgrade_config import ConfigError, Settings, find_pyproject, load_config, noqa_lines
from pt215.upgrade_fix import apply_edits, unified_diff
from pt215.upgrade_output import FORMATS, render, safe, statistics
from pt215.upgrade_py import Edit, scan_python
from pt215.upgrade_rules import ACC_POLICIES, FAILING, FR_LEGACY, RULES, Finding, Rule, explain, finding
from pt215.upgrade_text import admits, below_215, scan_patterns

__all__ = ["RULES", "Rule", "Finding", "ScanError", "FR_LEGACY", "ACC_POLICIES", "Report", "scan_text",
           "scan_file", "scan_paths", "scan", "iter_files", "kind_of", "admits", "main"]

SKIP_DIRS = {".venv", "venv", "_build", "build", "node_modules", "__pycache__", "site-packages"}
HIDDEN_OK = {".github", ".gitlab", ".circleci", ".buildkite"}
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
    return KINDS.get(path.suffix.lower())


def _is_ci(path: Path) -> bool:
    parts = path.parts
    return ".github" in parts or ".gitlab" in parts or path.name in (".gitlab-ci.yml", ".gitlab-ci.yaml") \
        or ".circleci" in parts or ".buildkite" in parts


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
    enc = "utf-8-sig"
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
        part = _File(path, "\n".join(py), "python", None)
        _scan_python_or_patterns(part, notes, cell=i)
        shell = scan_patterns("\n".join(sh), path, "shell")
        quiet = noqa_lines(src)
        for f in part.findings + shell.findings:
            if not _silenced(quiet, f):
                out.findings.append(replace(f, cell=i))
        out.pins += shell.pins + part.pins
        out.uses += part.uses


def _scan_python_or_patterns(f: _File, notes: list[str], cell: int | None = None) -> None:
    where = f"{safe(f.path)}" + (f":cell {cell}" if cell is not None else "")
    try:
        res = scan_python(f.text, f.path)
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


def _scan_file(f: _File, notes: list[str], ci: bool = False) -> None:
    if f.kind == "notebook":
        _scan_cells(f.text, f.path, f, notes)
    elif f.kind == "python":
        _scan_python_or_patterns(f, notes)
    else:
        res = scan_patterns(f.text, f.path, f.kind, ci=ci)
        f.findings += res.findings
        f.pins += res.pins
        f.edits += res.edits
    if f.kind != "notebook":
        f.findings += _cxx_standard(f)
        quiet = noqa_lines(f.text)
        f.findings = [x for x in f.findings if not _silenced(quiet, x)]
    f.findings = list(dict.fromkeys(f.findings))  # one per line, code and message


def _cxx_standard(f: _File) -> list[Finding]:
    """PT1516: a C++ standard below C++20 selected in a build file (CMake, a Makefile, setup.py, a shell line)."""
    from pt215.native import cxx_standard_problems

    if "c++" not in f.text.lower() and "cxx_std" not in f.text.lower() and "CXX_STANDARD" not in f.text:
        return []
    out = []
    for problem in cxx_standard_problems(f.text):  # CMake settings raised by find_package(Torch) are not problems
        where, what = problem.split(": ", 1)
        out.append(finding(f.path, int(where.removeprefix("line ")), "PT1516", what=what.split(" (torch")[0]))
    return out


def _resolve_pins(files: Sequence[_File]) -> list[Finding]:
    uses = [(f.path, line, api) for f in files for line, api in f.uses]
    if not uses:
        return []
    p0, l0, api = uses[0]
    out = []
    for f in files:
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
    notes: list[str] = []
    scanned: list[_File] = []
    internal = 0
    for p in files:
        kind = kind_of(p) or "shell"
        text, enc, note = _read(p, kind)
        if note:
            notes.append(note)
        if text is None:
            continue
        f = _File(str(p), text, kind, enc)
        try:
            _scan_file(f, notes, ci=_is_ci(p))
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
    f = _File(path, text, kind or kind_of(p) or "shell", "utf-8")
    _scan_file(f, [], ci=_is_ci(p))
    return sorted(f.findings + _resolve_pins([f]), key=lambda x: (x.cell or 0, x.line, x.code))


# ---------------------------------------------------------------- command line


def _fixes(report: Report) -> list[tuple[_File, str]]:
    """(file, fixed text) for every file whose reported findings have mechanical fixes."""
    wanted = {(x.path, x.line, x.code) for x in report.findings}
    out = []
    for f in report.files:
        if f.encoding is None or f.kind == "notebook":
            continue
        edits = [e for e in f.edits if (f.path, e.line if isinstance(e, Edit) else e[1],
                                        e.code if isinstance(e, Edit) else e[0]) in wanted]
        if edits:
            new = apply_edits(f.text, edits, python=f.kind == "python")
            if new != f.text:
                out.append((f, new))
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pt215.upgrade",
        description="Find what PyTorch 2.15 changes in code and configs (Python and notebooks by ast; shell, "
                    "Dockerfile, CI, YAML, TOML, INI, JSON, requirements by pattern). Exit 0: nothing at error or "
                    f"warning severity; 1: findings; 2: usage or internal error. Codes {min(RULES)}-{max(RULES)} "
                    "(book, chapter 7); --explain CODE describes one.",
        epilog="Configuration: [tool.pt215.upgrade] in the nearest pyproject.toml (select, ignore, extend-select, "
               "exclude, per-file-ignores). Silence a line with `# noqa` or `# noqa: PT15NN`.")
    ap.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to scan")
    ap.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    ap.add_argument("--select", action="append", metavar="CODES", help="report only these codes (comma-separated "
                    "codes or prefixes; replaces the configuration's select)")
    ap.add_argument("--extend-select", action="append", metavar="CODES", help="add codes to the selection")
    ap.add_argument("--ignore", action="append", metavar="CODES", help="do not report these codes")
    ap.add_argument("--exclude", action="append", default=[], metavar="NAME",
                    help="also skip directories or files with this name or path glob (repeatable)")
    ap.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    ap.add_argument("--statistics", action="store_true", help="print the number of findings per code")
    ap.add_argument("--explain", metavar="CODE", help="describe one code and exit")
    ap.add_argument("--fix", action="store_true", help="apply the mechanical fixes (PT1505, PT1508), then report")
    ap.add_argument("--diff", action="store_true", help="print the mechanical fixes as a diff; write nothing")
    ap.add_argument("--config", metavar="PYPROJECT", help="read [tool.pt215.upgrade] from this file")
    ap.add_argument("--isolated", action="store_true", help="ignore every pyproject.toml")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: findings on stdout, notes on stderr; exit 0, 1 (findings) or 2 (usage, internal error)."""
    ap = _parser()
    args = ap.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass
    try:
        return _run(args)
    except (ScanError, ConfigError) as e:
        print(f"pt215.upgrade: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - never a traceback, never the findings code
        print(f"pt215.upgrade: internal error: {type(e).__name__}: {safe(str(e))}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.explain:
        try:
            print(explain(args.explain))
        except KeyError as e:
            raise ConfigError(f"--explain: {e.args[0]}") from None
        return 0
    if not args.paths:
        raise ConfigError("no PATH given: name the files or directories to scan")
    if args.fix and args.diff:
        raise ConfigError("--fix and --diff: choose one (--diff previews what --fix writes)")
    if args.config:
        cfg = Path(args.config)
        if not cfg.is_file():
            raise ConfigError(f"--config: {args.config}: no such file")
    else:
        cfg = None if args.isolated else find_pyproject(Path.cwd())
    settings = load_config(cfg).merge_cli(args.select, args.ignore, args.extend_select, args.exclude)
    report = scan(args.paths, settings=settings)
    if args.diff or args.fix:
        fixes = _fixes(report)
        if args.diff:
            for f, new in fixes:
                sys.stdout.write(unified_diff(safe(f.path), f.text, new))
            print(f"{len(fixes)} file{'s' if len(fixes) != 1 else ''} would be changed by --fix.")
            return 1 if fixes and not args.exit_zero else 0
        for f, new in fixes:
            Path(f.path).write_bytes(new.encode(f.encoding or "utf-8", "surrogateescape"))
        before = len(report.findings)
        report = scan(args.paths, settings=settings)
        print(f"--fix: {len(fixes)} file{'s' if len(fixes) != 1 else ''} changed, "
              f"{before - len(report.findings)} finding{'s' if before - len(report.findings) != 1 else ''} fixed.",
              file=sys.stderr)
    for note in report.notes:
        print(f"pt215.upgrade: note: {note}", file=sys.stderr)
    text = render(report.findings, report.n_files, args.format, report.notes)
    if text:
        print(text)
    if args.statistics and report.findings:
        print(statistics(report.findings), file=sys.stderr if args.format != "text" else sys.stdout)
    if report.internal_errors:
        print(f"pt215.upgrade: internal error in {report.internal_errors} file(s), see the notes above: exit 2",
              file=sys.stderr)
        return 2
    failing = any(f.severity in FAILING for f in report.findings)
    return 1 if failing and not args.exit_zero else 0


if __name__ == "__main__":
    sys.exit(main())
