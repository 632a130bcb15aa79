"""The lines to put in your own job (chapter 2): every rank dumps its flight recorder when a step is stuck, sooner
than the collective timeout, and from its error path. Plain torch: nothing from the book's helper package.

    TORCH_FR_DUMP_TEMP_FILE=/shared/job-123/fr/rank_ torchrun --nproc-per-node 3 own_job.py --skip-rank 2

A toy training loop on gloo: each step is an all_reduce of the gradients and one of the metrics (in a
second group). In the last
step, `--skip-rank` skips the gradient all_reduce (the bug under study; -1: no bug). The stuck step's watchdog
dumps every rank after `--dump-after` seconds; the collective timeout (`--timeout`) then ends the job with an
error on every rank, as it would end yours, and the dumps stay in TORCH_FR_DUMP_TEMP_FILE's folder. Notebook
2.6 runs it and checks the dumps with `pt215.flight.diagnose`.
"""

from __future__ import annotations

import argparse
import datetime
import threading
from collections.abc import Sequence

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
from torch.distributed import _watchdog


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--skip-rank", type=int, default=-1, help="the rank that skips the last step's gradient sync")
    p.add_argument("--dump-after", type=float, default=1.0, help="seconds a step may take before every rank dumps")
    p.add_argument("--timeout", type=float, default=4.0, help="the collective timeout, seconds")
    a = p.parse_args(argv)
    if a.steps < 1 or not 0 < a.dump_after < a.timeout:
        p.error(f"need --steps >= 1 and 0 < --dump-after < --timeout, got {a.steps}, {a.dump_after}, {a.timeout}")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    metrics = dist.new_group(list(range(dist.get_world_size())), group_desc="metrics")  # as logging would use
    grad, loss = torch.ones(1024), torch.zeros(4)

    def train_step(step: int) -> None:
        if not (step == a.steps - 1 and rank == a.skip_rank):
            dist.all_reduce(grad)  # the gradient sync a rank "with nothing to sync" skips
        dist.all_reduce(loss, group=metrics)

    # --- the lines for your job: every rank dumps when stuck
    ring = "nccl2" if dist.get_backend() == "nccl" else "gloo"  # nccl-legacy: write c10d._dump_nccl_trace() yourself
    dumped = threading.Event()

    def dump_fr() -> None:  # to $TORCH_FR_DUMP_TEMP_FILE<rank>, a folder on shared storage
        if not dumped.is_set():  # keep the first dump: the one taken while the rank was stuck
            c10d._dump_fr_trace_file(rank, includeStackTraces=False, backend=ring)
            dumped.set()

    for step in range(a.steps):
        stuck = _watchdog.cpu_timeout(a.dump_after, dump_fr)  # sooner than the collective timeout
        try:
            train_step(step)
        except RuntimeError:  # a collective failed or timed out first: dump before the error ends the job
            dump_fr()
            raise
        finally:
            stuck.cancel()
    # --- end of the lines
    shutdown()
    return 0


def shutdown() -> None:
    """A clean end in plain torch: a barrier, then every rank confirms through the store that it has left it, then
    the groups go (a rank that tears gloo down while a peer still finishes the barrier can make that peer abort)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"own_job/left/{rank}", "1")
    store.wait([f"own_job/left/{r}" for r in range(world)], datetime.timedelta(seconds=60))
    dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
