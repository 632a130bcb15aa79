"""How `python -m pt215.upgrade` reports (chapter 7): text, JSON, GitHub annotations, SARIF, statistics.

Paths are printed safely whatever their bytes: an undecodable byte becomes `\\xNN`, a newline `\\n`, so one
finding is always one line.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from pt215.upgrade.rules import FAILING, RULES, Finding

__all__ = ["safe", "render", "statistics", "FORMATS"]

FORMATS = ("text", "json", "github", "sarif")
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def safe(text: str) -> str:
    """`text` printable on any terminal or log: lone surrogates (undecodable file-name bytes) and control
    characters escaped."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _gh(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def _summary(findings: Sequence[Finding], n_files: int) -> str:
    failing = sum(f.severity in FAILING for f in findings)
    files = f"{n_files} file{'s' if n_files != 1 else ''} scanned"
    if not findings:
        return f"No findings in {files}."
    info = len(findings) - failing
    extra = f" ({info} informational)" if info else ""
    return f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''}{extra} in {files}."


def render(findings: Sequence[Finding], n_files: int, fmt: str, notes: Sequence[str] = ()) -> str:
    """The report in one of FORMATS."""
    if fmt == "json":
        return json.dumps({"files_scanned": n_files, "findings": [
            {**f.as_dict(), "path": safe(f.path)} for f in findings], "notes": [safe(n) for n in notes]}, indent=2)
    if fmt == "github":
        return "\n".join(
            f"::{_GITHUB_LEVEL[f.severity]} file={_gh(safe(f.path), True)},line={f.line},"
            f"title={_gh(f.code, True)}::{_gh(f.message + ': ' + f.fix + ' (book: ' + f.section + ')')}"
            for f in findings)
    if fmt == "sarif":
        return json.dumps(_sarif(findings), indent=2)
    lines = [safe(f.text()) for f in findings]
    lines.append(_summary(findings, n_files))
    return "\n".join(lines)


def _sarif(findings: Sequence[Finding]) -> dict:
    rules = [{"id": r.code, "name": r.summary, "shortDescription": {"text": r.summary},
              "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
              "help": {"text": f"book: {r.section}"}} for r in RULES.values()]
    results = []
    for f in findings:
        region = {"startLine": max(f.line, 1)}
        loc: dict = {"physicalLocation": {"artifactLocation": {"uri": safe(f.path)}, "region": region}}
        if f.cell is not None:
            loc["logicalLocations"] = [{"name": f"cell {f.cell}", "kind": "notebookCell"}]
        results.append({"ruleId": f.code, "level": _SARIF_LEVEL[f.severity],
                        "message": {"text": f"{f.message}: {f.fix} (book: {f.section})"}, "locations": [loc]})
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "pt215.upgrade", "informationUri":
                                          "https://docs.oasis-open.org/sarif/sarif/v2.1.0/", "rules": rules}},
                      "results": results}]}


def statistics(findings: Sequence[Finding]) -> str:
    """`--statistics`: one line per code, most frequent first (like ruff)."""
    counts = Counter(f.code for f in findings)
    return "\n".join(f"{n:>5}  {code}  [{RULES[code].severity}]  {RULES[code].summary}"
                     for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
