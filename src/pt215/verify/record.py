"""The record of one `python -m pt215.verify` run, as typed fields: written by `pt215.verify`, read by the
website (`pt215.site.hardware_runs`) from `data/hardware-runs/*.json` (schema 1; chapters 0-6, 8 and 9).

    RunRecord(schema, date, command, seconds, machine: MachineRecord, checks: [CheckRecord], boundary)

`to_dict()` gives the JSON object the files hold (the keys of data/hardware-runs/README.md); `from_dict()` reads
one back and raises ValueError naming the file and the missing or bad key. No torch here: the website reads
records without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECK_KEYS", "MACHINE_KEYS", "REAL", "RECORD_KEYS", "SCHEMA", "STATUSES", "BoundaryFailure",
           "BoundaryRecord", "CheckRecord", "GpuRecord", "MachineRecord", "RunRecord"]

SCHEMA = 1
RECORD_KEYS = ("schema", "date", "command", "seconds", "machine", "checks")
MACHINE_KEYS = ("torch", "cuda", "driver", "nccl", "cudnn", "python", "platform", "macos", "mps", "gpus", "summary")
CHECK_KEYS = ("id", "chapter", "title", "needs", "status", "mode")
STATUSES = ("passed", "failed", "skipped")
REAL = "real"
"""`CheckRecord.mode` of a check that ran on the machine itself (else the fake-CUDA wording, `fake_cuda.MODE`)."""


def _need(d: Any, keys: Sequence[str], what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{what} is missing {missing}")
    return d


@dataclass(frozen=True)
class GpuRecord:
    """One CUDA GPU of the machine: `{name, capability: "sm_NN", memory_gib}`."""

    name: str
    capability: str
    memory_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "capability": self.capability, "memory_gib": self.memory_gib}

    @classmethod
    def from_dict(cls, d: Any, what: str = "gpu") -> GpuRecord:
        if not (isinstance(d, dict) and str(d.get("capability", "")).startswith("sm_") and d.get("name")):
            raise ValueError(f"{what}: each GPU needs a name and an sm_NN capability, got {d!r}")
        return cls(str(d["name"]), str(d["capability"]), d.get("memory_gib"))


@dataclass(frozen=True)
class MachineRecord:
    """The machine a run describes: versions, GPUs with capabilities, macOS (`pt215.verify.machine_record`)."""

    torch: str
    cuda: str | None
    driver: str | None
    nccl: str | None
    cudnn: str | None
    python: str
    platform: str
    macos: str | None
    mps: bool
    summary: str
    gpus: tuple[GpuRecord, ...] = ()
    nixl: bool | None = None

    @property
    def accelerated(self) -> bool:
        """Whether the machine had a CUDA GPU or an Apple GPU."""
        return bool(self.gpus or self.mps)

    def could_run(self, needs: Sequence[str]) -> bool:
        """Whether the machine as recorded could meet `needs` (a GPU result needs GPUs in the record)."""
        for need in needs:
            if need.startswith(("cuda", "sm_", "nccl")) and not self.gpus:
                return False
            if need.startswith(("mps", "macos")) and not self.mps:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"torch": self.torch, "cuda": self.cuda, "driver": self.driver, "nccl": self.nccl,
                "cudnn": self.cudnn, "python": self.python, "platform": self.platform, "macos": self.macos,
                "mps": self.mps, "nixl": self.nixl, "summary": self.summary,
                "gpus": [g.to_dict() for g in self.gpus]}

    @classmethod
    def from_dict(cls, d: Any, what: str = "machine") -> MachineRecord:
        d = _need(d, MACHINE_KEYS, what)
        if not isinstance(d["gpus"], list):
            raise ValueError(f"{what}: gpus must be a list, got {type(d['gpus']).__name__}")
        return cls(torch=str(d["torch"]), cuda=d["cuda"], driver=d["driver"], nccl=d["nccl"], cudnn=d["cudnn"],
                   python=str(d["python"]), platform=str(d["platform"]), macos=d["macos"], mps=bool(d["mps"]),
                   summary=str(d["summary"]), gpus=tuple(GpuRecord.from_dict(g, what) for g in d["gpus"]),
                   nixl=d.get("nixl"))


@dataclass(frozen=True)
class CheckRecord:
    """One gated path's result: passed (with `figures` and `limit`), failed or skipped (with a `reason`)."""

    id: str
    chapter: int
    title: str
    needs: tuple[str, ...]
    mode: str
    status: str
    where: str = ""
    reason: str | None = None
    figures: dict[str, Any] | None = None
    limit: str | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.id!r} has status {self.status!r}; expected one of {STATUSES}")
        if self.status != "passed" and not self.reason:
            raise ValueError(f"check {self.id!r} is {self.status} without a reason")

    @property
    def real(self) -> bool:
        """Whether the check ran on the machine itself (not on fake CUDA)."""
        return self.mode == REAL

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "chapter": self.chapter, "title": self.title, "where": self.where,
                               "needs": list(self.needs), "mode": self.mode, "status": self.status}
        if self.status == "passed":
            out.update(figures=self.figures if self.figures is not None else {}, limit=self.limit)
        else:
            out["reason"] = self.reason
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    @classmethod
    def from_dict(cls, d: Any, what: str = "check") -> CheckRecord:
        if isinstance(d, dict) and "id" in d:
            what = f"{what} {d['id']!r}"
        d = _need(d, CHECK_KEYS, what)
        if not isinstance(d["needs"], list) or not isinstance(d["chapter"], int):
            raise ValueError(f"{what}: needs must be a list and chapter an int, got {d['needs']!r}, {d['chapter']!r}")
        return cls(id=str(d["id"]), chapter=d["chapter"], title=str(d["title"]), needs=tuple(d["needs"]),
                   mode=str(d["mode"]), status=str(d["status"]), where=str(d.get("where", "")),
                   reason=d.get("reason"), figures=d.get("figures"), limit=d.get("limit"), seconds=d.get("seconds"))


@dataclass(frozen=True)
class BoundaryFailure:
    """A launched command that failed before its first hardware call (`pt215.verify.boundary`)."""

    where: str
    command: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "command": self.command, "detail": self.detail}


@dataclass(frozen=True)
class BoundaryRecord:
    """The run to the hardware boundary: how many commands, how many reached it or finished, which failed."""

    commands: int
    reached: int
    finished: int
    failed: tuple[BoundaryFailure, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"commands": self.commands, "reached": self.reached, "finished": self.finished,
                "failed": [f.to_dict() for f in self.failed]}

    @classmethod
    def from_dict(cls, d: Any, what: str = "boundary") -> BoundaryRecord:
        d = _need(d, ("commands", "reached", "finished", "failed"), what)
        failed = tuple(BoundaryFailure(**_need(f, ("where", "command", "detail"), f"{what}: a failed command"))
                       for f in d["failed"])
        return cls(int(d["commands"]), int(d["reached"]), int(d["finished"]), failed)


@dataclass(frozen=True)
class RunRecord:
    """One `python -m pt215.verify` run (schema 1): when, the command, the machine, one check per gated path,
    and (optionally) the run to the hardware boundary."""

    date: str
    command: str
    seconds: float
    machine: MachineRecord
    checks: tuple[CheckRecord, ...] = ()
    boundary: BoundaryRecord | None = None
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema, "date": self.date, "command": self.command,
                               "seconds": self.seconds, "machine": self.machine.to_dict(),
                               "checks": [c.to_dict() for c in self.checks]}
        if self.boundary is not None:
            out["boundary"] = self.boundary.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any, name: str = "record") -> RunRecord:
        """Read and check a record: every key present, schema 1, made by pt215.verify, statuses with reasons,
        and no real pass of a path whose hardware the recorded machine lacks."""
        if not isinstance(d, dict):
            raise ValueError(f"{name}: a record must be a JSON object, got {type(d).__name__}")
        missing = [k for k in RECORD_KEYS if k not in d]
        if missing:
            raise ValueError(f"{name}: missing keys {missing}")
        if d["schema"] != SCHEMA:
            raise ValueError(f"{name}: schema must be {SCHEMA}, got {d['schema']!r}")
        if not str(d["command"]).startswith("python -m pt215.verify"):
            raise ValueError(f"{name}: command must be the pt215.verify command that produced it, got {d['command']!r}")
        try:
            machine = MachineRecord.from_dict(d["machine"])
            boundary = BoundaryRecord.from_dict(d["boundary"]) if d.get("boundary") is not None else None
            if not isinstance(d["checks"], list) or not (d["checks"] or boundary is not None):
                raise ValueError("checks must be a non-empty list (or the record holds a boundary run)")
            checks = tuple(CheckRecord.from_dict(c) for c in d["checks"])
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        for c in checks:
            if c.status == "passed" and c.real and c.needs and not machine.could_run(c.needs):
                raise ValueError(f"{name}: check {c.id!r} passed for real but the machine lacks {list(c.needs)}")
        return cls(date=str(d["date"]), command=str(d["command"]), seconds=float(d["seconds"]), machine=machine,
                   checks=checks, boundary=boundary, schema=d["schema"])

    def label(self) -> str:
        """`2x NVIDIA H200 sm_90, torch 2.15.0, driver 570.86, cuDNN 9.26.0, 2026-12-01` (or the CPU/Mac
        description): the run as the website names it."""
        m = self.machine
        if m.gpus:
            names = sorted({f"{g.name} {g.capability}" for g in m.gpus})
            where = f"{len(m.gpus)}x " + ", ".join(names)
        elif m.mps:
            where = f"Apple MPS, macOS {m.macos}"
        else:
            where = m.summary
        parts = [where, f"torch {m.torch}"]
        if m.driver:
            parts.append(f"driver {m.driver}")
        if m.gpus and m.cudnn:
            parts.append(f"cuDNN {m.cudnn}")
        parts.append(self.date[:10])
        return ", ".join(parts)

