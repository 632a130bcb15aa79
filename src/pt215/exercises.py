"""Exercises next to the work: a checking cell for an answer that is a value (every notebook's exercises).

An exercise in a notebook is a markdown cell (the task, then its solution in a collapsed block) and, where the
answer is a number, a name or a set, a code cell the reader edits followed by a checking cell:

    answer_2_2_1 = None   # your answer: the rank that never entered the all-reduce
    check("2.2.1", answer_2_2_1, expected=3)

`check` prints one line: "not answered yet" while the answer is None (what the stored notebook shows), "correct"
or "not yet" with a hint. It never raises on a wrong answer: the notebook stays runnable top to bottom.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

__all__ = ["check"]


def _matches(answer: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected
    if isinstance(expected, int | float) and isinstance(answer, int | float):
        return math.isclose(float(answer), float(expected), rel_tol=rel_tol, abs_tol=rel_tol * 1e-9)
    if isinstance(expected, str) and isinstance(answer, str):
        return answer.strip().lower() == expected.strip().lower()
    if isinstance(expected, set | frozenset) and isinstance(answer, Collection) and not isinstance(answer, str):
        return set(answer) == set(expected)
    return answer == expected


def check(exercise: str, answer: Any, *, expected: Any, rel_tol: float = 0.0, hint: str = "") -> bool:
    """Print whether `answer` is right for `exercise` (e.g. "2.2.1"); return True when it is.

    Numbers match within `rel_tol` (0: exactly), strings case-insensitively, sets as sets. `hint` is shown after a
    wrong answer. `answer=None` means not answered yet.
    """
    if not isinstance(exercise, str) or not exercise.strip():
        raise ValueError(f"check(): exercise must name the exercise, like '2.2.1'; got {exercise!r}")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float) or not 0 <= rel_tol < 1:
        raise ValueError(f"check(): rel_tol must be a number in [0, 1), got {rel_tol!r}")
    if answer is None:
        print(f"Exercise {exercise}: not answered yet (set your answer in the cell above and run both cells)")
        return False
    if _matches(answer, expected, float(rel_tol)):
        print(f"Exercise {exercise}: correct")
        return True
    print(f"Exercise {exercise}: not yet ({answer!r})" + (f"; hint: {hint}" if hint else ""))
    return False
