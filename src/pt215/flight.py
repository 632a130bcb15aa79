"""Read, repair and diagnose flight-recorder dumps (chapter 2, "The flight recorder hang lab").

torch 2.15 writes one dump per rank (pickle by `_dump_fr_trace_file` and the watchdogs; JSON from
`_dump_fr_trace_json` or the `fr_trace_json` debug handler). This module:

- `load_dumps(dump_dir)`: reads every rank's dump (pickle or JSON), with clear errors for an empty folder,
  unreadable or truncated files, duplicate ranks and dumps mixed from different jobs;
- `repair(dumps)` / `write_repaired(dump_dir, out_dir)`: rebuilds `pg_config` from the entries. Raw gloo dumps
  key it by an empty name (`''`, with the ranks of whichever group was created last) and omit sub-groups,
  which makes torch's analyzer (`python -m torch.distributed.flight_recorder.fr_trace`) crash with a KeyError;
- `diagnose(dump_dir)`: structured findings, one per stuck process group (group, collective sequence id,
  operation, sizes/dtypes, ranks that reached it, ranks missing or mismatched, where the missing ranks are);
- `timeline(dumps)` / `plot_timeline(dumps)`: sequence ids over time per rank; `plot_wait_for(diag)`: the
  wait-for graph of a diagnosis (ranks grouped by where they are once a job is large);
- `settled_trace()`: an in-process dump taken once every group's completions have caught up (gloo marks a
  collective completed on its worker thread, shortly after `wait()` returns);
- `apply_rank_env(...)`: a rank-dependent environment override, applied before `init_process_group`;
- `cvar_names(header)`: which environment variables a torch header's lists name, in the order they are read;
- `write_synthetic_job(...)`: a fire drill, one dump per rank of a planted hang at any scale (1,024 ranks in 2.6);
- `TRIAGE` and `plot_triage_tree()`: the symptom -> cause -> next step table of the runbook (2.6);
- a CLI: `python -m pt215.flight DIR [--json] [--repair-to OUT] [--allow-incomplete]`.

Limits: point-to-point operations (send/recv) appear in the timeline but are not matched across ranks; a
sub-group member that never recorded an operation on that group cannot be found in gloo dumps.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import pickle
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VARS",
    "TRIAGE",
    "Diagnosis",
    "DumpError",
    "Finding",
    "RankDump",
    "apply_rank_env",
    "cvar_names",
    "diagnose",
    "load_dump",
    "load_dumps",
    "main",
    "plot_timeline",
    "plot_triage_tree",
    "plot_wait_for",
    "rank_ranges",
    "repair",
    "run_analyzer",
    "settled_trace",
    "timeline",
    "user_frame",
    "write_repaired",
    "write_synthetic_job",
]

# name, legacy name it replaces (None if new), default in torch 2.15, what it does.
# Defaults come from torch/csrc/distributed/c10d/FlightRecorder.hpp of the installed wheel; chapter 2 checks
# the ones that can be checked on CPU by experiment.
ENV_VARS: list[tuple[str, str | None, str, str]] = [
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
     "entries kept in each backend's ring buffer (gloo, nccl2, ...); 0 turns recording off"),
    ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT", "true",
     "write the dump when a collective times out or fails (NCCL watchdog / FlightRecorderHook abort)"),
    ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "$XDG_CACHE_HOME/torch/comm_lib_trace_rank_",
     "dump file prefix; the rank is appended"),
    ("TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "15000",
     "how long one dump attempt on the failure path may take"),
    ("TORCH_FR_CPP_STACK", "TORCH_NCCL_TRACE_CPP_STACK", "false", "record C++ stacks in the entries"),
    ("TORCH_FR_DUMP_DYNAMIC_FILE_NAME", None, "unset",
     "1: every file dump re-reads TORCH_FR_DUMP_TEMP_FILE and writes to that exact path, no rank appended"),
    ("TORCH_INCLUDE_STACK_TRACE", None, "true", "include Python stack frames in a dump"),
    ("TORCH_INCLUDE_ONLY_ACTIVE", None, "false", "dump only collectives that have not completed"),
]

#: The settings the legacy `ProcessGroupNCCL` (`nccl-legacy`, `TORCH_DIST_USE_NCCL2=0`) reads itself, under the
#: legacy name only (its own lists in `ProcessGroupNCCL.hpp`): a job that may roll back sets both names.
LEGACY_ONLY: tuple[str, ...] = ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                                "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")

#: The runbook's tree (chapter 2.6): what the dumps (or the job) show, the likely cause, the next step.
TRIAGE: list[tuple[str, str, str]] = [
    ("a group's collective misses rank R, and R is in no collective",
     "R is stuck outside communication: compute, data loading, I/O, a Python deadlock",
     "take R's stack (py-spy dump, kill -USR1 with faulthandler, dump_traceback), not more dumps"),
    ("two groups wait on each other (a cycle)",
     "a rank skipped a collective, or issued two in a different order",
     "the rank alone on one side; read its stack or the frame the dump recorded"),
    ("every member reached collective N, but ops, sizes or dtypes differ",
     "a rank-dependent branch, an uneven batch, dtype drift",
     "the mismatched ranks; reproduce with TORCH_DISTRIBUTED_DEBUG=DETAIL"),
    ("the world group misses R, and R waits in a sub-group",
     "the fault is in the sub-group; the world group is only where it shows",
     "follow the chain to the sub-group where a member is missing"),
    ("a rank has no dump, or a dump with no entries",
     "it crashed or was killed first; or its recorder was off (TORCH_FR_BUFFER_SIZE=0 there)",
     "its exit code, dmesg and Xid errors, its environment; diagnose the rest with --allow-incomplete"),
    ("every member completed every collective",
     "not a collective hang",
     "the host: data pipeline, checkpoint I/O, the scheduler; NCCL_DEBUG=WARN for the network"),
]

_REQUIRED = ("entries", "pg_config", "version")
_ENTRY_KEYS = ("pg_id", "process_group", "collective_seq_id", "profiling_name", "input_sizes")
_RANK_RE = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")
_SLACK_S = 5.0  # clock slack allowed when matching one collective's creation times across ranks


class DumpError(ValueError):
    """A dump folder or file cannot be used: the message names the file and what was expected."""


@dataclass
class RankDump:
    """One rank's flight-recorder dump as read from disk."""

    rank: int
    path: Path
    format: str  # "pickle" or "json"
    version: str
    entries: list[dict[str, Any]]
    pg_config: dict[str, dict[str, Any]]
    pg_status: dict[str, dict[str, int]]
    raw: dict[str, Any] = field(repr=False)


@dataclass
class Finding:
    """One problem: the first collective of a process group that did not complete on every member."""

    kind: str  # "missing" (some members never issued it) or "mismatch" (members issued different ops)
    group: str  # process-group name, e.g. "0"
    group_desc: str  # e.g. "default_pg"
    seq_id: int  # collective sequence id within that group
    op: str  # profiling name as most ranks recorded it, e.g. "gloo:all_reduce"
    sizes: list[Any]  # input sizes as most ranks recorded them
    dtypes: list[str]
    reached: list[int]  # global ranks that issued this collective (with the op above)
    missing: list[int]  # members that never issued it
    mismatched: dict[int, str] = field(default_factory=dict)  # rank -> "op sizes dtypes" it issued instead
    where: dict[int, str] = field(default_factory=dict)  # missing/mismatched rank -> where it is instead

    def describe(self) -> str:
        head = (f"group {self.group}:{self.group_desc} seq {self.seq_id} {self.op} "
                f"sizes={self.sizes} dtypes={self.dtypes}: reached by rank{'s' if len(self.reached) > 1 else ''} "
                f"{rank_ranges(self.reached)}")
        lines = [head]
        by_where: dict[str, list[int]] = {}
        for r in self.missing:
            by_where.setdefault(self.where.get(r, "no dump"), []).append(r)
        for where, ranks in by_where.items():
            lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} missing; {where}")
        for r, what in sorted(self.mismatched.items()):
            lines.append(f"  rank {r} mismatched: issued {what} instead")
        return "\n".join(lines)


@dataclass
class Diagnosis:
    """What `diagnose` found in a dump folder."""

    ranks: list[int]
    groups: dict[str, dict[str, Any]]  # name -> {"desc", "ranks"}
    findings: list[Finding]
    position: dict[int, str]  # rank -> where it is (its oldest unfinished collective, or "not in a collective")
    cycle: list[str]  # groups that wait on each other in a cycle (a deadlock across groups), or []
    repaired: list[str]  # what repair() had to fix
    silent: list[int] = field(default_factory=list)  # ranks whose dump holds nothing (their recorder was off)

    @property
    def healthy(self) -> bool:
        return not self.findings

    def _root(self) -> Finding:
        in_cycle = [f for f in self.findings if f"{f.group}:{f.group_desc}" in self.cycle and f.missing]
        def size(f: Finding) -> int:  # members whose dumps say something: a silent rank cannot be placed
            return len([r for r in self.groups[f.group]["ranks"] if r not in self.silent])
        return min(in_cycle, key=lambda f: (size(f), len(f.missing), f.group))

    @property
    def suspects(self) -> list[int]:
        """In a cycle, the ranks missing from the smallest stuck group (then: the fewest missing): the rank that
        skipped a collective, or issued it later, is on that side; the others in the cycle only wait. [] without a
        cycle."""
        if not self.cycle or not any(f.missing for f in self.findings):
            return []
        return sorted(self._root().missing)

    def by_position(self) -> dict[str, list[int]]:
        """Where the ranks are, each place with the ranks there, the most common first: the view of a large job."""
        out: dict[str, list[int]] = {}
        for r in self.ranks:
            out.setdefault(self.position[r], []).append(r)
        return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[1][0])))

    def summary(self) -> str:
        lines = [f"ranks with dumps: {rank_ranges(self.ranks)}"]
        if self.repaired:
            lines.append("repaired: " + "; ".join(self.repaired))
        for where, ranks in sorted(self.by_position().items(), key=lambda kv: kv[1][0]):
            lines.append(f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}: {where}")
        if self.healthy:
            lines.append("verdict: no stuck collective (every member of every group completed its last collective)")
            return "\n".join(lines)
        for f in self.findings:
            lines.append(f"{f.kind.upper()}: " + f.describe())
        lines.append("verdict: " + self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        if self.healthy:
            return "healthy"
        parts = []
        if self.silent:
            parts.append(f"{_ranks_word(self.silent)} recorded nothing (recorder off there: TORCH_FR_BUFFER_SIZE=0?): "
                         "the dumps cannot say where; take the stacks")
        for f in self.findings:
            if f.kind == "mismatch":
                parts.append(f"{_ranks_word(sorted(f.mismatched))} issued a different collective at "
                             f"{f.group}:{f.group_desc} seq {f.seq_id}")
        nodump = sorted({r for f in self.findings for r in f.missing if r not in self.position})
        if nodump:
            parts.append(f"{_ranks_word(nodump)} wrote no dump (crashed or killed first?): read the exit code and "
                         "the node's log")
        idle = sorted({r for f in self.findings for r in f.missing if self.position.get(r) == "not in a collective"})
        if idle:
            parts.append(f"{_ranks_word(idle)} never reached the collective and {'is' if len(idle) == 1 else 'are'} "
                         "in no collective (compute, data loading or a Python hang): take the stack")
        if self.cycle:
            parts.append("groups " + " -> ".join(self.cycle) + " wait on each other: ranks skipped a collective "
                         "or issued collectives in different orders")
            if self.suspects:
                f = self._root()
                parts.append(f"suspect: {_ranks_word(self.suspects)}, missing from {f.group}:{f.group_desc} (the "
                             "smallest stuck group, then the one fewest ranks are missing from): read its stack: did "
                             "it skip that collective, or issue it later?")
        if not parts:
            parts.append(_ranks_word(sorted({r for f in self.findings for r in f.missing}))
                         + " never reached a collective the others are waiting in")
        return "; ".join(parts)


def _ranks_word(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {rank_ranges(ranks)}"


def rank_ranges(ranks: Sequence[int]) -> str:
    """Ranks as short text: runs of three or more as `a-b` (`[0, 1, 2, 3, 5, 7, 8]` -> `0-3, 5, 7, 8`)."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    out: list[str] = []
    start = prev = rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev - start >= 2 else ", ".join(str(x) for x in range(start, prev + 1)))
        if r is not None:
            start = prev = r
    return ", ".join(out)


# ---------------------------------------------------------------- loading


def _rank_from_name(path: Path) -> int:
    m = _RANK_RE.search(path.name)
    if not m:
        raise DumpError(f"{path.name}: cannot tell the rank from the file name (expected it to end in the rank, "
                        "as torch writes <prefix><rank>)")
    return int(m.group(1))


def load_dump(path: str | Path, rank: int | None = None) -> RankDump:
    """Read one dump file (pickle as torch writes it, or JSON from `_dump_fr_trace_json`)."""
    p = Path(path)
    if not p.is_file():
        raise DumpError(f"{p.name}: not a file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DumpError(f"{p.name}: unreadable ({e.strerror})") from None
    if not data:
        raise DumpError(f"{p.name}: empty file (the rank died while dumping?)")
    fmt = "json" if data.lstrip()[:1] == b"{" else "pickle"
    try:
        obj = json.loads(data) if fmt == "json" else pickle.loads(data)  # noqa: S301 - reading our own dumps
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError, IndexError) as e:
        raise DumpError(f"{p.name}: truncated or corrupt {fmt} dump ({type(e).__name__}); "
                        "expected a complete flight-recorder dump") from None
    if not isinstance(obj, dict) or any(k not in obj for k in _REQUIRED):
        have = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise DumpError(f"{p.name}: not a flight-recorder dump (expected keys {list(_REQUIRED)}, found {have})")
    entries = []
    for i, e in enumerate(obj["entries"]):
        if not isinstance(e, dict) or any(k not in e for k in _ENTRY_KEYS):
            raise DumpError(f"{p.name}: entry {i} lacks {[k for k in _ENTRY_KEYS if k not in e]}")
        e = dict(e)
        e["process_group"] = tuple(e["process_group"])
        entries.append(e)
    return RankDump(
        rank=_rank_from_name(p) if rank is None else rank, path=p, format=fmt, version=str(obj["version"]),
        entries=entries, pg_config=dict(obj["pg_config"]), pg_status=_int_status(obj.get("pg_status") or {}), raw=obj,
    )


def _int_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """`pg_status` with integer sequence ids: the JSON dump (`fr_trace_json`) writes them as strings."""
    def num(v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v
    return {k: {f: num(v) for f, v in s.items()} if isinstance(s, Mapping) else s for k, s in status.items()}


def _ranks_of(info: Mapping[str, Any]) -> list[int]:
    ranks = info.get("ranks", [])
    if isinstance(ranks, str):
        return list(_parse_ranks(ranks))
    return [int(r) for r in ranks]


@functools.lru_cache(maxsize=4096)
def _parse_ranks(text: str) -> tuple[int, ...]:
    """A `pg_config` rank list as torch writes it ("[0, 1, 2]"); every rank of a group repeats the same string."""
    try:
        ranks = json.loads(text)
    except ValueError:
        ranks = ast.literal_eval(text)
    return tuple(int(r) for r in ranks)


def _check_same_job(dumps: Mapping[int, RankDump]) -> None:
    versions = {d.version for d in dumps.values()}
    if len(versions) > 1:
        raise DumpError(f"mixed dumps: different format versions {sorted(versions)}; expected one job's dumps")
    # Same group name -> same description on every rank.
    desc: dict[str, tuple[str, int]] = {}
    for d in dumps.values():
        for e in d.entries:
            name, dsc = e["process_group"]
            if name in desc and desc[name][0] != dsc:
                raise DumpError(f"mixed dumps: group {name!r} is {desc[name][0]!r} on rank {desc[name][1]} but "
                                f"{dsc!r} on rank {d.rank}; expected one job's dumps")
            desc.setdefault(name, (dsc, d.rank))
    # A collective that completed on two ranks was in flight on both at the same time: its creation times can
    # differ by at most its timeout. Dumps from different runs fail this. One pass: the earliest and the latest
    # creation time of each completed collective, over all ranks.
    span: dict[tuple[str, int], list[Any]] = {}  # key -> [t_min, rank_min, t_max, rank_max, limit_s]
    for r, d in dumps.items():
        for e in d.entries:
            t = e.get("time_created_ns")
            if not t or e.get("is_p2p") or not _completed(d, e):
                continue
            key = (e["process_group"][0], e["collective_seq_id"])
            limit = (e.get("timeout_ms") or 0) / 1e3
            s = span.get(key)
            if s is None:
                span[key] = [t, r, t, r, limit]
                continue
            if t < s[0]:
                s[0], s[1] = t, r
            if t > s[2]:
                s[2], s[3] = t, r
            s[4] = max(s[4], limit)
    for (pg, seq), (t_min, r_min, t_max, r_max, limit) in sorted(span.items()):
        gap = (t_max - t_min) / 1e9
        if gap > limit + _SLACK_S:
            a, b = sorted((r_min, r_max))
            raise DumpError(
                f"mixed dumps: {dumps[a].path.name} and {dumps[b].path.name} both completed collective "
                f"{pg}:{seq} but {gap:.0f} s apart (timeout {limit:.0f} s); expected dumps from one run of one job")


def load_dumps(dump_dir: str | Path, *, allow_incomplete: bool = False) -> dict[int, RankDump]:
    """Read every rank's dump in `dump_dir` (files whose names end in the rank, as torch writes them).

    Raises `DumpError` for a missing or empty folder, an unreadable/truncated/foreign file, two files for one
    rank, dumps from different jobs, and (unless `allow_incomplete`) ranks of the job without a dump.
    """
    d = Path(dump_dir)
    if not d.is_dir():
        raise DumpError(f"dump_dir {str(dump_dir)!r} is not a folder")
    files = sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
    if not files:
        raise DumpError(f"dump_dir {d.name!r} is empty: expected one flight-recorder dump per rank "
                        "(files named <prefix><rank>, e.g. rank_0)")
    dumps: dict[int, RankDump] = {}
    for f in files:
        dump = load_dump(f)
        if dump.rank in dumps:
            raise DumpError(f"two dumps for rank {dump.rank}: {dumps[dump.rank].path.name} and {f.name}; "
                            "expected one file per rank")
        dumps[dump.rank] = dump
    _check_same_job(dumps)
    world = _world_size(dumps)
    absent = [r for r in range(world) if r not in dumps]
    if absent and not allow_incomplete:
        raise DumpError(f"no dump from rank(s) {absent} of a {world}-rank job; pass allow_incomplete=True "
                        "(CLI: --allow-incomplete) to diagnose without them")
    return dict(sorted(dumps.items()))


def _world_size(dumps: Mapping[int, RankDump]) -> int:
    world = max(dumps) + 1
    for d in dumps.values():
        for info in d.pg_config.values():
            ranks = _ranks_of(info)
            if ranks:
                world = max(world, max(ranks) + 1)
    return world


# ---------------------------------------------------------------- repair


def _status(d: RankDump, pg_id: Any) -> dict[str, int]:
    return d.pg_status.get(str(pg_id), {})


def _completed(d: RankDump, e: Mapping[str, Any]) -> bool:
    if e.get("state") == "completed":
        return True
    done = _status(d, e["pg_id"]).get("last_completed_collective", -1)
    return e["collective_seq_id"] <= done


def _groups(dumps: Mapping[int, RankDump]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every group's name -> {"desc", "ranks"}, from well-formed pg_config entries and from the entries."""
    world = _world_size(dumps)
    groups: dict[str, dict[str, Any]] = {}
    fixes: list[str] = []
    seen_in: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for d in dumps.values():
        for e in d.entries:
            name, desc = e["process_group"]
            seen_in.setdefault(name, set()).add(d.rank)
            descs[name] = desc
    for d in dumps.values():
        for key, info in d.pg_config.items():
            if key and info.get("name", key) == key:  # a proper entry (NCCL, hooked backends)
                groups.setdefault(key, {"desc": info.get("desc", ""), "ranks": _ranks_of(info)})
    if any("" in d.pg_config for d in dumps.values()):
        fixes.append("pg_config keyed by '' (gloo) replaced by one entry per group")
    for name in sorted(seen_in, key=lambda n: (len(n), n)):
        if name in groups:
            continue
        if descs[name] == "default_pg":
            ranks = list(range(world))
        else:
            ranks = sorted(seen_in[name])
            fixes.append(f"group {name}:{descs[name]} missing from pg_config; members taken from the entries "
                         f"{ranks}")
        groups[name] = {"desc": descs[name], "ranks": ranks}
    return groups, fixes


def repair(dumps: Mapping[int, RankDump]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Return raw dump dicts that torch's analyzer accepts, and the list of what was fixed.

    Every rank gets the same `pg_config` (one entry per group, keyed by the group name, ranks as the string
    the analyzer parses); JSON dumps are turned into the pickle layout (tuples, None for unset times).
    """
    groups, fixes = _groups(dumps)
    pg_config = {n: {"name": n, "desc": g["desc"], "ranks": str(g["ranks"])} for n, g in groups.items()}
    fixed: dict[int, dict[str, Any]] = {}
    for r, d in dumps.items():
        raw = dict(d.raw)
        entries = []
        for e in d.entries:
            e = dict(e)
            if d.format == "json":
                for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                    if not e.get(k):
                        e[k] = None
            e.setdefault("frames", [])
            entries.append(e)
        raw.update(entries=entries, pg_config=pg_config)
        fixed[r] = raw
    if any(d.format == "json" for d in dumps.values()):
        fixes.append("JSON dumps converted to the pickle layout")
    return fixed, fixes


def write_repaired(dump_dir: str | Path, out_dir: str | Path, *, allow_incomplete: bool = False,
                   prefix: str = "rank_") -> list[str]:
    """Repair the dumps in `dump_dir` and write them as `<out_dir>/<prefix><rank>` pickles; return the fixes."""
    fixed, fixes = repair(load_dumps(dump_dir, allow_incomplete=allow_incomplete))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for r, raw in fixed.items():
        (out / f"{prefix}{r}").write_bytes(pickle.dumps(raw))
    return fixes


# ---------------------------------------------------------------- diagnosis


def _op_text(e: Mapping[str, Any]) -> str:
    return f"{e['profiling_name']} {list(e['input_sizes'])} {list(e.get('input_dtypes', []))}"


def user_frame(e: Mapping[str, Any]) -> str | None:
    """Where the user's code issued entry `e`: the innermost recorded Python frame outside torch, as
    `file.py:line in function` (the file's name only), or None when the dump holds no frames."""
    for f in e.get("frames") or ():
        name = str(f.get("filename", ""))
        if not name or "/torch/" in name.replace("\\", "/") or name.startswith("torch/") or name.startswith("<"):
            continue
        return f"{Path(name).name}:{f.get('line')} in {f.get('name')}"
    return None


def _silent(d: RankDump) -> bool:
    """A dump that holds nothing at all: written by a rank whose recorder was off (TORCH_FR_BUFFER_SIZE=0)."""
    return not d.entries and not d.pg_status


def _position(d: RankDump, done_by_a_peer: set[tuple[str, int]] | frozenset = frozenset()) -> tuple[str, str | None]:
    """(text, group name) of the rank's oldest collective that has not completed, if any.

    A collective some member of its group has completed is not one this rank waits in, even where its own entry
    still reads "started": a peer can only finish it once every rank has contributed, and a rank's recorder may
    mark its last collective completed late (`done_by_a_peer`: (group name, sequence id) pairs). Where the dump
    holds Python frames, the text ends with the line of the user's code that issued the collective.
    """
    if _silent(d):
        return "recorded nothing (its recorder was off: TORCH_FR_BUFFER_SIZE=0 on this rank?)", None
    pending = [e for e in d.entries if not e.get("is_p2p") and not _completed(d, e)
               and (e["process_group"][0], e["collective_seq_id"]) not in done_by_a_peer]
    if not pending:
        return "not in a collective", None
    e = min(pending, key=lambda e: e["record_id"])
    name, desc = e["process_group"]
    where = user_frame(e)
    at = f", issued at {where}" if where else ""
    return f"waiting in {name}:{desc} seq {e['collective_seq_id']} {_op_text(e)}{at}", name


def _find_cycle(edges: Mapping[str, set[str]]) -> list[str]:
    for start in sorted(edges):
        path, node, seen = [start], start, {start}
        while True:
            nxt = sorted(edges.get(node, ()))
            if not nxt:
                break
            node = nxt[0]
            if node in seen:
                i = path.index(node)
                return path[i:] + [node]
            seen.add(node)
            path.append(node)
    return []


def diagnose(dump_dir: str | Path | Mapping[int, RankDump], *, allow_incomplete: bool = False) -> Diagnosis:
    """Read the raw dumps in `dump_dir` (gloo or NCCL, pickle or JSON), repair them, and find what is stuck.

    For every process group, the first collective sequence id that not every member completed is examined:
    members that never issued it are `missing` (with where they are instead); members that issued a different
    operation, size or dtype are `mismatched`. Only that first problem per group is reported: later ones are
    its consequences.
    """
    dumps = dump_dir if isinstance(dump_dir, Mapping) else load_dumps(dump_dir, allow_incomplete=allow_incomplete)
    if not dumps:
        raise DumpError("diagnose(): no dumps given")
    groups, fixes = _groups(dumps)
    silent = sorted(r for r, d in dumps.items() if _silent(d))
    done_by_a_peer = {(e["process_group"][0], e["collective_seq_id"]) for d in dumps.values() for e in d.entries
                      if not e.get("is_p2p") and _completed(d, e)}
    positions = {r: _position(d, done_by_a_peer) for r, d in dumps.items()}
    findings: list[Finding] = []
    for name, g in groups.items():
        # a member without a dump ("no dump") or with an empty one (its recorder was off) is left out of the
        # comparison, since nothing says what it issued; it is the suspect of a collective all the others are in
        members = [r for r in g["ranks"] if r in dumps and r not in silent]
        quiet = [r for r in g["ranks"] if r not in members]
        ops: dict[int, dict[int, dict[str, Any]]] = {r: {} for r in members}
        last: dict[int, int] = {r: -1 for r in members}
        for r in members:
            d = dumps[r]
            mine = {e["collective_seq_id"]: e for e in d.entries
                    if e["process_group"][0] == name and not e.get("is_p2p")}
            ops[r] = mine
            pg_ids = {e["pg_id"] for e in mine.values()}
            st = [_status(d, p).get("last_enqueued_collective", -1) for p in pg_ids]
            last[r] = max([*mine, *st, 0])
        if not members:
            continue
        top = max(last.values())
        # First sequence id not completed on every member that has it, or not issued by every member.
        for seq in range(1, top + 1):
            have = {r: ops[r][seq] for r in members if seq in ops[r]}
            issued = [r for r in members if last[r] >= seq]
            if len(issued) == len(members) and have and all(_completed(dumps[r], e) for r, e in have.items()):
                continue
            if not have:
                continue  # evicted from every ring buffer: nothing to compare
            texts: dict[str, list[int]] = {}
            for r, e in have.items():
                texts.setdefault(_op_text(e), []).append(r)
            major = max(texts.items(), key=lambda kv: (len(kv[1]), -min(kv[1])))
            ref = have[major[1][0]]
            missing = [r for r in members if last[r] < seq]
            mismatched = {r: t for t, rs in texts.items() if t != major[0] for r in rs}
            if not missing and not mismatched:
                if not quiet:
                    continue  # everyone is in it and it matches: stuck because of another group
                missing = quiet  # every member that recorded is in it: the silent ones are the only suspects
            where = {r: positions[r][0] if r in positions else "no dump" for r in [*missing, *mismatched]}
            findings.append(Finding(
                kind="mismatch" if mismatched else "missing", group=name, group_desc=g["desc"], seq_id=seq,
                op=ref["profiling_name"], sizes=list(ref["input_sizes"]), dtypes=list(ref.get("input_dtypes", [])),
                reached=sorted(major[1]), missing=missing, mismatched=mismatched, where=where,
            ))
            break
    # A group whose missing ranks wait in another group depends on that group.
    edges: dict[str, set[str]] = {}
    for f in findings:
        for r in f.missing:
            other = positions[r][1] if r in positions else None
            if other is not None and other != f.group:
                edges.setdefault(f.group, set()).add(other)
    cycle = _find_cycle(edges)
    named = {n: f"{n}:{g['desc']}" for n, g in groups.items()}
    return Diagnosis(
        ranks=sorted(dumps), groups=groups, findings=findings,
        position={r: p[0] for r, p in positions.items()}, cycle=[named[n] for n in cycle], repaired=fixes,
        silent=silent,
    )


# ---------------------------------------------------------------- timeline


def timeline(dumps: Mapping[int, RankDump]) -> list[dict[str, Any]]:
    """One row per recorded collective: rank, group, seq id, op, completed?, seconds since the first entry."""
    times = [e["time_created_ns"] for d in dumps.values() for e in d.entries if e.get("time_created_ns")]
    t0 = min(times) if times else 0
    rows = []
    for r, d in dumps.items():
        for e in d.entries:
            rows.append({
                "rank": r, "group": f"{e['process_group'][0]}:{e['process_group'][1]}",
                "seq": e["collective_seq_id"], "op": e["profiling_name"], "p2p": bool(e.get("is_p2p")),
                "completed": _completed(d, e), "t": ((e.get("time_created_ns") or t0) - t0) / 1e9,
            })
    return rows


def plot_timeline(dumps: Mapping[int, RankDump], ax: Any = None, title: str | None = None) -> Any:
    """Plot each rank's collectives over time (x: seconds since the first entry, y: rank; label: group/seq).

    Completed collectives are dots, one colour per group; collectives still pending when the rank dumped are
    crosses in vermillion.
    """
    import matplotlib.pyplot as plt

    from pt215.figures import COLORS, use_style

    use_style()
    rows = timeline(dumps)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.9 + 0.7 * len(dumps)))
    groups = sorted({row["group"] for row in rows}, key=lambda g: (len(g.split(":")[0]), g))
    offs = {g: (i - (len(groups) - 1) / 2) * 0.18 for i, g in enumerate(groups)}
    colors = [COLORS[c] for c in ("blue", "green", "orange", "purple", "sky", "grey", "black")]
    for i, g in enumerate(groups):
        color = colors[i % len(colors)]
        pts = [row for row in rows if row["group"] == g]
        done = [p for p in pts if p["completed"]]
        ax.scatter([p["t"] for p in done], [p["rank"] + offs[g] for p in done], s=22, color=color, label=g)
        for p in pts:
            ax.annotate(str(p["seq"]), (p["t"], p["rank"] + offs[g]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points", color=color)
        stuck = [p for p in pts if not p["completed"]]
        ax.scatter([p["t"] for p in stuck], [p["rank"] + offs[g] for p in stuck], s=70, marker="x",
                   color=COLORS["vermillion"], zorder=3)
    ax.scatter([], [], s=70, marker="x", color=COLORS["vermillion"], label="not completed")
    ax.set_yticks(sorted(dumps))
    ax.set_yticklabels([f"rank {r}" for r in sorted(dumps)])
    ax.set_ylim(max(dumps) + 0.6, min(dumps) - 0.6)
    ax.set_xlabel("seconds since the first recorded collective (labels: sequence id in its group)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title)
    return ax


def plot_wait_for(diag: Diagnosis, ax: Any = None, *, group_ranks: bool | None = None) -> Any:
    """Draw the wait-for graph of `diag`: ranks on the left, stuck collectives on the right; a rank points at the
    collective it waits in, a collective points back at each rank it still needs. A cycle of arrows is a deadlock.

    With `group_ranks` (default: when the job has more than 8 ranks) a node stands for every rank in one place
    (`Diagnosis.by_position`), labelled with its ranks and their count, so a 1,024-rank job stays legible.
    """
    import matplotlib.pyplot as plt

    from pt215.figures import COLORS, use_style

    use_style()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    grouped = len(diag.ranks) > 8 if group_ranks is None else group_ranks
    if grouped:
        nodes = [(f"ranks {rank_ranges(rs)}\n({len(rs)} rank{'s' if len(rs) > 1 else ''})", rs)
                 for rs in sorted(diag.by_position().values(), key=lambda rs: rs[0])]
    else:
        nodes = [(f"rank {r}", [r]) for r in diag.ranks]
    node_of = {r: i for i, (_, rs) in enumerate(nodes) for r in rs}
    colls = [f"{f.group}:{f.group_desc}\nseq {f.seq_id} {f.op.split(':')[-1].replace('_into_tensor', '')}"
             .replace("_tensor", "") for f in diag.findings]
    n = max(len(nodes), 1)
    ry = {i: n - 1 - i for i in range(len(nodes))}
    cy = {c: (n - 1) * (1 - (i + 0.5) / len(colls)) if len(colls) > 1 else (n - 1) / 2 for i, c in enumerate(colls)}
    x0 = 1.0 if grouped else 0.45  # where arrows leave the rank nodes: wider labels when grouped
    for i, (label, _) in enumerate(nodes):
        ax.text(0, ry[i], label, ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#dde8f5", "ec": COLORS["blue"]})
    for c in colls:
        ax.text(2.85, cy[c], c, ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#f7e6cc", "ec": COLORS["orange"]})
    for f, c in zip(diag.findings, colls, strict=True):
        for i in sorted({node_of[r] for r in f.reached if r in node_of}):
            ax.annotate("", xy=(2.2, cy[c] + 0.08), xytext=(x0, ry[i] + 0.05),
                        arrowprops={"arrowstyle": "->", "color": COLORS["blue"]})
        for i in sorted({node_of[r] for r in f.missing if r in node_of}):
            ax.annotate("", xy=(x0, ry[i] - 0.05), xytext=(2.2, cy[c] - 0.08),
                        arrowprops={"arrowstyle": "->", "color": COLORS["vermillion"], "linestyle": "--"})
    ax.plot([], [], color=COLORS["blue"], label="ranks wait in the collective")
    ax.plot([], [], color=COLORS["vermillion"], linestyle="--", label="the collective needs these ranks")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, frameon=False)
    ax.set_xlim(-1.3 if grouped else -0.7, 3.9)
    ax.set_ylim(-0.7, n - 0.3)
    ax.axis("off")
    return ax


# ---------------------------------------------------------------- in-process helpers


def settled_trace(*, backend: str = "gloo", timeout_s: float = 30.0, **dump_options: Any) -> dict[str, Any]:
    """This process's dump (`_dump_fr_trace`, unpickled) once every group's `last_completed_collective` has caught
    up with its `last_enqueued_collective`.

    gloo marks a collective completed on its worker thread, shortly after `wait()` returns on the issuing thread:
    a dump taken at once can show the last collective unfinished on a loaded machine (usually for milliseconds; on
    a loaded machine it has taken over 10 s). This waits for the state it returns (polling cheap dumps without
    entries, at most `timeout_s`), then takes the dump asked for, and raises
    `TimeoutError` naming the groups that did not catch up. The poll is cheap on purpose: the first dump with
    Python frames in a process can take seconds (it imports torch's compiler stack), and its `pg_status` is read
    before that work.
    """
    import time

    import torch._C._distributed_c10d as c10d

    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise ValueError(f"settled_trace(): timeout_s must be a positive number of seconds, got {timeout_s!r}")

    def behind(trace: Mapping[str, Any]) -> dict[str, Any]:
        return {k: st for k, st in (trace.get("pg_status") or {}).items()
                if st.get("last_completed_collective", -1) < st.get("last_enqueued_collective", -1)}

    deadline = time.monotonic() + timeout_s
    while lagging := behind(pickle.loads(c10d._dump_fr_trace(  # noqa: S301 - our own dump
            backend=backend, includeCollectives=False, includeStackTraces=False))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"settled_trace(): groups {sorted(lagging)} did not mark their last collective "
                               f"completed within {timeout_s} s: {lagging}")
        time.sleep(0.01)
    trace = pickle.loads(c10d._dump_fr_trace(backend=backend, **dump_options))  # noqa: S301 - our own dump
    if lagging := behind(trace):  # completions only move forward: a new collective was issued meanwhile
        raise TimeoutError(f"settled_trace(): groups {sorted(lagging)} issued a collective while waiting: {lagging}")
    return trace


_OVERRIDE = re.compile(r"(\d+):([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")


def apply_rank_env(overrides: Sequence[str], rank: int | None = None) -> dict[str, str]:
    """Apply the `RANK:NAME=VALUE` overrides that name this rank to `os.environ`; return what was applied.

    A rank-dependent environment (one node with another setting) is a classic cause of a job that behaves
    differently on one rank. Call it before `init_process_group`, so the recorder and the backends read it.
    `rank` defaults to the launcher's `RANK`.
    """
    import os

    if isinstance(overrides, str):
        raise ValueError(f"apply_rank_env(): overrides must be a list of 'RANK:NAME=VALUE' strings, got {overrides!r}")
    if rank is None:
        if "RANK" not in os.environ:
            raise ValueError("apply_rank_env(): rank not given and RANK is not set (not started by a launcher?)")
        rank = int(os.environ["RANK"])
    applied: dict[str, str] = {}
    for item in overrides:
        m = _OVERRIDE.match(str(item))
        if not m:
            raise ValueError(f"apply_rank_env(): override {item!r} is not 'RANK:NAME=VALUE' (e.g. "
                             "'2:TORCH_FR_BUFFER_SIZE=0')")
        if int(m.group(1)) == rank:
            applied[m.group(2)] = m.group(3)
    os.environ.update(applied)
    return applied


_CVAR_LIST = re.compile(r"static\s+std::vector<std::string>\s+(\w+)\s*=\s*\{([^}]*)\}", re.S)
_CVAR_CALL = re.compile(r"getCvar(?:Int|Bool|String)\(\s*\{([^}]*)\}", re.S)


def cvar_names(header: str) -> dict[str, tuple[str, ...]]:
    """The environment-variable lists a torch header declares, each in the order torch reads it (the first name
    that is set wins): `static std::vector<std::string> NAME = {"A", "B"}` as `NAME: ("A", "B")`, and an inline
    `getCvarInt({"A", "B"}, ...)` as `A: ("A", "B")`. `header` is the header's text."""
    if not isinstance(header, str):
        raise ValueError(f"cvar_names(): header must be the header's text (a str), got {type(header).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for m in _CVAR_LIST.finditer(header):
        out[m.group(1)] = tuple(re.findall(r'"([^"]+)"', m.group(2)))
    for m in _CVAR_CALL.finditer(header):
        names = tuple(re.findall(r'"([^"]+)"', m.group(1)))
        if names:
            out.setdefault(names[0], names)
    return out


# ---------------------------------------------------------------- a fire drill at scale


def write_synthetic_job(out_dir: str | Path, *, world: int = 1024, tp: int = 8, steps: int = 20,
                        culprit: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Write one dump per rank of a planted hang in a `world`-rank job, as NCCL2's recorder lays dumps out.

    Each step issues an all_gather and a reduce_scatter in the rank's tensor-parallel group (`tp` consecutive
    ranks, `group_desc` "tp") and an all_reduce over all ranks. In the last step `culprit` skips its group's
    reduce_scatter and goes on to the all_reduce: its `tp - 1` peers wait in the reduce_scatter, every other rank
    in the all_reduce. The entries carry the keys of a real 2.15 dump (`pg_config` keyed by group name, states
    "completed"/"scheduled", Python frames of a `train.py`). A rehearsal for reading a thousand dumps; returns
    what was planted: {"world", "tp", "culprit", "tp_group", "peers", "entries_per_rank", "files"}.
    """
    import random

    for name, v, low in (("world", world, 2), ("tp", tp, 2), ("steps", steps, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"write_synthetic_job(): {name} must be an int >= {low}, got {v!r}")
    if world % tp:
        raise ValueError(f"write_synthetic_job(): world ({world}) must be a multiple of tp ({tp})")
    rng = random.Random(seed)
    culprit = rng.randrange(world) if culprit is None else culprit
    if not 0 <= culprit < world:
        raise ValueError(f"write_synthetic_job(): culprit must be a rank in [0, {world}), got {culprit}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = 1_800_000_000 * 10**9
    step_ns = 400 * 10**6
    timeout_ms = 600_000
    ops = (("nccl:all_gather_into_tensor", "tp", [[4096, 1024]], "train.py", 61, "forward"),
           ("nccl:reduce_scatter_tensor", "tp", [[4096, 1024]], "train.py", 74, "backward"),
           ("nccl:all_reduce", "default_pg", [[1048576]], "train.py", 88, "sync_grads"))
    tp_group_of = {r: r // tp for r in range(world)}
    my_tp = tp_group_of[culprit]
    peers = [r for r in range(my_tp * tp, (my_tp + 1) * tp) if r != culprit]
    for r in range(world):
        g = tp_group_of[r]
        names = {"default_pg": ("0", 0), "tp": (str(1 + g), 1)}
        seq = {"default_pg": 0, "tp": 0}
        done = {"default_pg": 0, "tp": 0}
        entries: list[dict[str, Any]] = []
        for step in range(steps):
            last = step == steps - 1
            for k, (op, grp, sizes, file, line, fn) in enumerate(ops):
                if last and r == culprit and op == "nccl:reduce_scatter_tensor":
                    continue  # the planted fault: this rank has "nothing to reduce" in the last step
                if last and r in peers and op == "nccl:all_reduce":
                    continue  # its peers never get past the reduce_scatter that waits for it
                seq[grp] += 1
                name, pg_id = names[grp]
                pending = last and (grp == "default_pg" or (g == my_tp and op == "nccl:reduce_scatter_tensor"))
                if not pending:
                    done[grp] = seq[grp]
                t = t0 + step * step_ns + k * step_ns // 4 + rng.randrange(2_000_000)
                entries.append({
                    "record_id": len(entries), "pg_id": pg_id, "process_group": (name, grp),
                    "collective_seq_id": seq[grp], "p2p_seq_id": 0, "op_id": seq[grp], "profiling_name": op,
                    "time_created_ns": t, "input_sizes": sizes, "input_dtypes": ["BFloat16"], "output_sizes": sizes,
                    "output_dtypes": ["BFloat16"], "state": "scheduled" if pending else "completed",
                    "time_discovered_started_ns": None if pending else t + 1000,
                    "time_discovered_completed_ns": None if pending else t + 2_000_000, "retired": not pending,
                    "timeout_ms": timeout_ms, "is_p2p": False, "thread_id": "140000000000000",
                    "thread_name": "pt_main_thread",
                    "frames": [{"name": op.split(":")[1], "filename": "torch/distributed/distributed_c10d.py",
                                "line": 4174},
                               {"name": fn, "filename": file, "line": line},
                               {"name": "<module>", "filename": file, "line": 120}],
                })
        members = {"0": list(range(world)), str(1 + g): list(range(g * tp, (g + 1) * tp))}
        descs = {"0": "default_pg", str(1 + g): "tp"}
        dump = {
            "version": "2.10", "comm_lib_version": "2.29.2", "entries": entries,
            "pg_config": {n: {"name": n, "desc": descs[n], "ranks": str(m)} for n, m in members.items()},
            "pg_status": {str(names[grp][1]): {"last_enqueued_collective": seq[grp], "last_started_collective": -1,
                                               "last_completed_collective": done[grp]} for grp in names},
        }
        (out / f"rank_{r}").write_bytes(pickle.dumps(dump))
    return {"world": world, "tp": tp, "culprit": culprit, "tp_group": f"{1 + my_tp}:tp", "peers": peers,
            "entries_per_rank": 3 * steps, "files": world}


# ---------------------------------------------------------------- the runbook's tree


def plot_triage_tree(rows: Sequence[tuple[str, str, str]] | None = None) -> Any:
    """Draw `TRIAGE` (or `rows`) as a tree: symptom -> likely cause -> next step, one row per symptom."""
    import textwrap

    from pt215.diagrams import arrow, box, canvas, note

    rows = list(TRIAGE if rows is None else rows)
    if not rows or any(len(r) != 3 for r in rows):
        raise ValueError("plot_triage_tree(): rows must be (symptom, cause, next step) triples")
    h = 1.0
    fig, ax = canvas(7.5, 0.9 + 1.05 * len(rows), xlim=(0, 12), ylim=(-0.2, len(rows) * h + 0.7))
    for x, title in ((0.0, "what you see"), (4.1, "likely cause"), (8.2, "next step")):
        note(ax, x + 1.9, len(rows) * h + 0.4, title, fontsize=10)
    fills = ("sky", "orange", "green")
    for i, row in enumerate(rows):
        y = (len(rows) - 1 - i) * h
        for col, text in enumerate(row):
            x = 4.1 * col
            box(ax, x, y + 0.05, 3.8, h - 0.1, textwrap.fill(text, 34), fill=fills[col], fontsize=7)
            if col < 2:
                arrow(ax, (x + 3.8, y + h / 2), (x + 4.1, y + h / 2))
    return fig, ax


# ---------------------------------------------------------------- torch's analyzer


def run_analyzer(dump_dir: str | Path, *args: str) -> tuple[str, str | None]:
    """Run torch's analyzer (`python -m torch.distributed.flight_recorder.fr_trace DIR ARGS`) in this process.

    Returns (what it printed, None) or (what it printed before failing, "ExceptionType: message").
    """
    import contextlib
    import io
    import logging

    from torch.distributed.flight_recorder.fr_trace import main as fr_main

    log = logging.getLogger("Flight Recorder")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = log.handlers[:]
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    error = None
    try:
        with contextlib.redirect_stdout(buf):
            fr_main([str(dump_dir), *args])
    except SystemExit as e:  # `-j` ends with sys.exit(0)
        if e.code not in (0, None):
            error = f"SystemExit: {e.code}"
    except Exception as e:  # noqa: BLE001 - the point is to show how it fails
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        log.handlers = saved
    return buf.getvalue(), error


# ---------------------------------------------------------------- CLI


def _to_json(diag: Diagnosis) -> dict[str, Any]:
    out = asdict(diag)
    out["verdict"] = diag.verdict()
    for f in out["findings"]:
        f["mismatched"] = {str(k): v for k, v in f["mismatched"].items()}
        f["where"] = {str(k): v for k, v in f["where"].items()}
    out["position"] = {str(k): v for k, v in out["position"].items()}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pt215.flight DIR [--json] [--repair-to OUT] [--allow-incomplete]`: diagnose a dump folder."""
    p = argparse.ArgumentParser(prog="python -m pt215.flight", description=main.__doc__)
    p.add_argument("dump_dir", help="folder with one flight-recorder dump per rank")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--repair-to", metavar="OUT", help="also write repaired dumps for torch's analyzer to OUT")
    p.add_argument("--allow-incomplete", action="store_true", help="diagnose even if some ranks have no dump")
    a = p.parse_args(argv)
    try:
        diag = diagnose(a.dump_dir, allow_incomplete=a.allow_incomplete)
        if a.repair_to:
            write_repaired(a.dump_dir, a.repair_to, allow_incomplete=a.allow_incomplete)
    except DumpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(_to_json(diag), indent=1) if a.json else diag.summary())
    return 0 if diag.healthy else 1


if __name__ == "__main__":
    raise SystemExit(main())
