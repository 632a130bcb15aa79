"""Elastic reconfigure on gloo: form -> shrink -> grow, handles exchanged through a store (chapter 1, notebook 1.2).

    torchrun --nproc-per-node 3 reconfigure.py

init_process_group(enable_reconfigure=True) creates the group without a communicator. Each process
publishes its handle (dist._get_reconfigure_handle()) in a key-value store; dist._reconfigure(uuid,
handles) then (re)builds the communicator over exactly those peers, the list order giving the ranks.
Here process 1 "leaves" after the first round and "returns" for the third.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown

LEAVER = 1  # the process that leaves and comes back (so the one after it changes rank)


def probe(stage: str, log: list[dict]) -> None:
    """all_reduce(ones) in the current communicator; print and log this process's rank and the group size."""
    t = torch.ones(1)
    dist.all_reduce(t)
    row = {"stage": stage, "rank": dist.get_rank(), "size": dist.get_world_size(), "all_reduce": t.item()}
    log.append(row)
    print(f"{stage:<7} now rank {row['rank']} of {row['size']}; all_reduce(ones) = {row['all_reduce']:.0f}")


def handles_of(store: dist.Store, me: int, stage: str, members: list[int]) -> list[str]:
    """Publish this process's handle for `stage`, then read every member's, in member order."""
    store.set(f"{stage}/handle/{me}", dist._get_reconfigure_handle())
    return [store.get(f"{stage}/handle/{m}").decode() for m in members]


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options
    job = init_rank("gloo", enable_reconfigure=True)  # a group without a communicator
    me, n0 = job.rank, job.world  # me: the launcher rank, a stable name for this process, not its rank later
    store = dist.distributed_c10d._get_default_store()  # the rendezvous store doubles as the control plane
    log: list[dict] = []

    print(f"supports reconfigure: {dist._supports_reconfigure()}")
    try:  # no communicator yet
        dist.all_reduce(torch.ones(1))
    except RuntimeError as e:
        print(f"before any reconfigure: RuntimeError: {str(e).splitlines()[0]}")

    # 1. form: every process joins
    everyone = list(range(n0))
    dist._reconfigure(uuid=1, handles=handles_of(store, me, "form", everyone)).wait()
    probe("form", log)

    # 2. shrink: one process goes away (a failed node); the others rebuild without it
    survivors = [m for m in everyone if m != LEAVER]
    if me in survivors:
        dist._reconfigure(uuid=2, handles=handles_of(store, me, "shrink", survivors)).wait()
        probe("shrink", log)
        store.set(f"shrink/done/{me}", "1")
    else:
        print("shrink  left the job (waits for the others to finish without it)")
        store.wait([f"shrink/done/{m}" for m in survivors])

    # 3. grow: it comes back; a new uuid, fresh handles from everyone
    dist._reconfigure(uuid=3, handles=handles_of(store, me, "grow", everyone)).wait()
    probe("grow", log)

    report({"me": me, "stages": log})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
