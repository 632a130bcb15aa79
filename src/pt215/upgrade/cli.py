"""The command line of the upgrade scanner: `python -m pt215.upgrade PATH...` (chapter 7).

Findings on stdout, notes on stderr; exit 0 (nothing failing), 1 (findings at error or warning severity) or 2 (a
usage or internal error). `--fix`/`--diff` apply or preview the mechanical fixes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pt215.upgrade.config import ConfigError, find_pyproject, load_config
from pt215.upgrade.fix import apply_edits, edit_key, unified_diff
from pt215.upgrade.output import FORMATS, render, safe, statistics
from pt215.upgrade.rules import FAILING, RULES, explain
from pt215.upgrade.scanner import Report, ScanError, _File, scan

__all__ = ["main"]


def _fixes(report: Report) -> list[tuple[_File, str]]:
    """(file, fixed text) for every file whose reported findings have mechanical fixes."""
    wanted = {(x.path, x.line, x.code) for x in report.findings}
    out = []
    for f in report.files:
        if f.encoding is None or f.kind == "notebook":
            continue
        edits = [e for e in f.edits if (f.path, *edit_key(e)) in wanted]
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

