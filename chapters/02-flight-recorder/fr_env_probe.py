"""Probe how torch 2.15's flight recorder reads its environment (chapter 2, part 1).

Records 8 gloo all_reduces on one rank, then reports how many entries the recorder kept and which
file `_dump_fr_trace_file` wrote, relative to the folder given by `--root`.

    torchrun --nproc-per-node 1 fr_env_probe.py --root /tmp/probe
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="folder in which to look for the written dump")
    p.add_argument("--ops", type=int, default=8)
    a = p.parse_args(argv)
    if a.ops < 1:
        p.error(f"--ops must be >= 1, got {a.ops}")
    root = Path(a.root)
    rank = init_rank("gloo").rank
    for _ in range(a.ops):
        dist.all_reduce(torch.ones(4))
    trace = pickle.loads(c10d._dump_fr_trace())
    before = {f for f in root.rglob("*") if f.is_file()}
    c10d._dump_fr_trace_file(rank)
    written = sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f not in before)
    seqs = [e["collective_seq_id"] for e in trace["entries"]]
    print(f"entries kept: {len(seqs)}  seq ids: {seqs}  dump written to: {written}")
    report({"entries": len(seqs), "seq_ids": seqs, "written": written})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
