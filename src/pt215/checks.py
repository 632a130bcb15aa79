"""One check's verdict: the record that `pt215.doctor` (workshop pre-flight) and the upgrade checklist share.

Used by `python -m pt215.doctor` (Running a workshop) and the "Upgrading a job to 2.15" chapter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

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
