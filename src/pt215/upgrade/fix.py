"""`python -m pt215.upgrade --fix` / `--diff` (chapter 7): the mechanical rewrites, applied or previewed.

Two rewrites are mechanical, because they keep what the job did on 2.14: PT1505 adds
`reduce_dtype=<the param_dtype expression>` (2.14 reduced in param_dtype), and PT1508 raises a simple
`>=3.x` Python requirement to `>=3.11`, deleting the `Programming Language :: Python :: 3.10` (and older)
classifiers of the same file so that the metadata agrees with itself. A Python file is written only if it still
parses after the edit.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence

from pt215.upgrade.python import Edit
from pt215.upgrade.text import LineEdit

__all__ = ["apply_edits", "unified_diff", "edit_key"]


def edit_key(e: Edit | LineEdit) -> tuple[int, str]:
    """(line, code) of the finding an edit belongs to: it is applied only when that finding is reported."""
    return (e.line, e.code) if isinstance(e, Edit) else (e.key, e.code)


def apply_edits(text: str, edits: Sequence[Edit | LineEdit], python: bool) -> str:
    """`text` with the edits applied (overlapping ones skipped); unchanged if the result would not parse."""
    lines = text.splitlines(keepends=True)
    done: list[tuple[tuple[int, int], tuple[int, int]]] = []
    spans: list[tuple[tuple[int, int], tuple[int, int], str | None]] = []
    for e in edits:
        if isinstance(e, Edit):
            spans.append((e.start, e.end, e.text))
        elif 1 <= e.target <= len(lines):
            old = lines[e.target - 1]
            end = old[len(old.rstrip("\r\n")):]
            if e.text is None:
                spans.append(((e.target, 0), (e.target, len(old)), None))
            else:
                spans.append(((e.target, 0), (e.target, len(old) - len(end)), e.text.rstrip("\r\n")))
    for start, end, new in sorted(spans, key=lambda s: (s[0], s[1]), reverse=True):
        if any(not (end <= a or start >= b) and not (start == end == a) for a, b in done):
            continue
        (l0, c0), (l1, c1) = start, end
        if not (1 <= l0 <= l1 <= len(lines)):
            continue
        if new is None:  # delete the whole line
            del lines[l0 - 1]
        else:
            head, tail = lines[l0 - 1][:c0], lines[l1 - 1][c1:]
            lines[l0 - 1: l1] = [head + new + tail]
        done.append((start, end))
    out = "".join(lines)
    if python:
        try:
            ast.parse(out)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return text
    return out


def unified_diff(path: str, before: str, after: str) -> str:
    """A `diff -u` of one file, as `--diff` prints it."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))
