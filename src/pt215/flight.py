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
- `timeline(dumps)` / `plot_timeline(dumps)`: sequence ids over time per rank;
- a CLI: `python -m pt215.flight DIR [--json] [--repair-to OUT] [--allow-incomplete]`.

Limits: point-to-point operations (send/recv) appear in the timeline but are not matched across ranks; a
sub-group member that never recorded an operation on that group cannot be found in gloo dumps.
"""

from __future__ import annotations

import argparse
import ast
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
    "Diagnosis",
    "DumpError",
    "Finding",
    "RankDump",
    "diagnose",
    "load_dump",
    "load_dumps",
    "main",
    "plot_timeline",
    "repair",
    "run_analyzer",
    "timeline",
    "write_repaired",
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
    ("TORCH_FR_DUMP_DYNAMIC_FILE_NAME", None, "unset", "dynamic dump file name"),
    ("TORCH_INCLUDE_STACK_TRACE", None, "true", "include Python stack frames in a dump"),
    ("TORCH_INCLUDE_ONLY_ACTIVE", None, "false", "dump only collectives that have not completed"),
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
                f"sizes={self.sizes} dtypes={self.dtypes}: reached by ranks {self.reached}")
        lines = [head]
        for r in self.missing:
            lines.append(f"  rank {r} missing; {self.where.get(r, 'no dump')}")
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

    @property
    def healthy(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        lines = [f"ranks with dumps: {self.ranks}"]
        if self.repaired:
            lines.append("repaired: " + "; ".join(self.repaired))
        for r in self.ranks:
            lines.append(f"rank {r}: {self.position[r]}")
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
        for f in self.findings:
            if f.kind == "mismatch":
                parts.append(f"ranks {sorted(f.mismatched)} issued a different collective at "
                             f"{f.group}:{f.group_desc} seq {f.seq_id}")
        idle = sorted({r for f in self.findings for r in f.missing if self.position.get(r) == "not in a collective"})
        if idle:
            parts.append(f"rank(s) {idle} never reached the collective and are in no collective "
                         "(compute, data loading or a Python hang): take their stacks")
        if self.cycle:
            parts.append("groups " + " -> ".join(self.cycle) + " wait on each other: ranks skipped a collective "
                         "or issued collectives in different orders")
        if not parts:
            parts.append("ranks " + str(sorted({r for f in self.findings for r in f.missing}))
                         + " never reached a collective the others are waiting in")
        return "; ".join(parts)


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
        ranks = ast.literal_eval(ranks)
    return [int(r) for r in ranks]


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
    # differ by at most its timeout. Dumps from different runs fail this.
    ranks = sorted(dumps)
    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            da, db = dumps[a], dumps[b]
            done_b = {}
            for e in db.entries:
                if not e.get("is_p2p") and _completed(db, e):
                    done_b[(e["process_group"][0], e["collective_seq_id"])] = e
            for e in da.entries:
                other = done_b.get((e["process_group"][0], e["collective_seq_id"]))
                if other is None or e.get("is_p2p") or not _completed(da, e):
                    continue
                t1, t2 = e.get("time_created_ns"), other.get("time_created_ns")
                if not t1 or not t2:
                    continue
                limit = max(e.get("timeout_ms") or 0, other.get("timeout_ms") or 0) / 1e3 + _SLACK_S
                gap = abs(t1 - t2) / 1e9
                if gap > limit:
                    raise DumpError(
                        f"mixed dumps: {da.path.name} and {db.path.name} both completed collective "
                        f"{e['process_group'][0]}:{e['collective_seq_id']} but {gap:.0f} s apart (timeout "
                        f"{limit - _SLACK_S:.0f} s); expected dumps from one run of one job")


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


def _position(d: RankDump, done_by_a_peer: set[tuple[str, int]] | frozenset = frozenset()) -> tuple[str, str | None]:
    """(text, group name) of the rank's oldest collective that has not completed, if any.

    A collective some member of its group has completed is not one this rank waits in, even where its own entry
    still reads "started": a peer can only finish it once every rank has contributed, and a rank's recorder may
    mark its last collective completed late (`done_by_a_peer`: (group name, sequence id) pairs).
    """
    pending = [e for e in d.entries if not e.get("is_p2p") and not _completed(d, e)
               and (e["process_group"][0], e["collective_seq_id"]) not in done_by_a_peer]
    if not pending:
        return "not in a collective", None
    e = min(pending, key=lambda e: e["record_id"])
    name, desc = e["process_group"]
    return f"waiting in {name}:{desc} seq {e['collective_seq_id']} {_op_text(e)}", name


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
    done_by_a_peer = {(e["process_group"][0], e["collective_seq_id"]) for d in dumps.values() for e in d.entries
                      if not e.get("is_p2p") and _completed(d, e)}
    positions = {r: _position(d, done_by_a_peer) for r, d in dumps.items()}
    findings: list[Finding] = []
    for name, g in groups.items():
        members = list(g["ranks"])  # a member without a dump counts as missing ("no dump")
        ops: dict[int, dict[int, dict[str, Any]]] = {r: {} for r in members}
        last: dict[int, int] = {r: -1 for r in members}
        for r in members:
            if r not in dumps:
                continue
            d = dumps[r]
            mine = {e["collective_seq_id"]: e for e in d.entries
                    if e["process_group"][0] == name and not e.get("is_p2p")}
            ops[r] = mine
            pg_ids = {e["pg_id"] for e in mine.values()}
            st = [_status(d, p).get("last_enqueued_collective", -1) for p in pg_ids]
            last[r] = max([*mine, *st, 0])
        if not any(r in dumps for r in members):
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
                continue  # everyone is in it and it matches: stuck because of another group
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

    Completed collectives are dots; collectives still pending when the rank dumped are red crosses.
    """
    import matplotlib.pyplot as plt

    rows = timeline(dumps)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 + 0.7 * len(dumps)))
    groups = sorted({row["group"] for row in rows}, key=lambda g: (len(g.split(":")[0]), g))
    offs = {g: (i - (len(groups) - 1) / 2) * 0.18 for i, g in enumerate(groups)}
    colors = [f"C{k}" for k in range(10) if k != 3]  # C3 is red: kept for "not completed"
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
                   color="red", zorder=3)
    ax.scatter([], [], s=70, marker="x", color="red", label="not completed")
    ax.set_yticks(sorted(dumps))
    ax.set_yticklabels([f"rank {r}" for r in sorted(dumps)])
    ax.set_ylim(max(dumps) + 0.6, min(dumps) - 0.6)
    ax.set_xlabel("seconds since the first recorded collective (labels: sequence id in its group)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title)
    return ax


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
