"""Probe how torch 2.15's flight recorder reads its environment (chapter 2, notebook 2.1).

Each rank records 8 gloo all_reduces, then reports how many entries its recorder kept and which file
`_dump_fr_trace_file` wrote, relative to its own folder `<root>/rank<r>`. The recorder reads its settings once,
when the process first records, so every rank is one probe: `--rank-env R:NAME=VALUE` sets NAME=VALUE on rank R
only, before the process group exists (`{root}` in VALUE stands for that rank's folder). `XDG_CACHE_HOME` points
into the rank's folder too, so the default location can be seen without writing into the home cache.

    torchrun --nproc-per-node 2 fr_env_probe.py --root /tmp/probe --rank-env 1:TORCH_FR_BUFFER_SIZE=3
"""

from __future__ import annotations

import argparse
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

from pt215.flight import apply_rank_env
from pt215.launch import init_rank, report, shutdown


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="folder under which each rank looks for the dump it wrote")
    p.add_argument("--ops", type=int, default=8)
    p.add_argument("--rank-env", action="append", default=[], metavar="R:NAME=VALUE",
                   help="set NAME=VALUE on rank R only ({root} is that rank's folder); repeatable")
    a = p.parse_args(argv)
    if a.ops < 1:
        p.error(f"--ops must be >= 1, got {a.ops}")
    rank = int(os.environ.get("RANK", "0"))
    root = Path(a.root) / f"rank{rank}"
    try:
        applied = apply_rank_env(a.rank_env, rank)
    except ValueError as e:
        p.error(f"--rank-env: {e}")
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg")
    (root / "xdg").mkdir(parents=True, exist_ok=True)
    for name, value in applied.items():
        os.environ[name] = value.replace("{root}", str(root))
        if "{root}" in value:  # a file prefix in the rank's folder: its folder must exist
            Path(os.environ[name]).parent.mkdir(parents=True, exist_ok=True)
    init_rank("gloo")
    for _ in range(a.ops):
        dist.all_reduce(torch.ones(4))
    trace = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))
    before = {f for f in root.rglob("*") if f.is_file()}
    c10d._dump_fr_trace_file(rank, includeStackTraces=False)
    written = sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f not in before)
    seqs = [e["collective_seq_id"] for e in trace["entries"]]
    print(f"set: {sorted(applied) or 'nothing'}; entries kept: {len(seqs)}; dump written to: {written}")
    report({"set": sorted(applied), "entries": len(seqs), "seq_ids": seqs, "written": written})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
