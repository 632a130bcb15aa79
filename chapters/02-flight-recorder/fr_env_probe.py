"""Probe how torch 2.15's flight recorder reads its environment (chapter 2, part 1).

Records 8 gloo all_reduces on one rank, then reports how many entries the recorder kept and which
file `_dump_fr_trace_file` wrote, relative to the folder given by `--root`.

    torchrun --nproc-per-node 1 fr_env_probe.py --root /tmp/probe
"""

import argparse
import pickle
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

from pt215.launch import report, shutdown


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, help="folder in which to look for the written dump")
    p.add_argument("--ops", type=int, default=8)
    a = p.parse_args()
    root = Path(a.root)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
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


if __name__ == "__main__":
    main()
