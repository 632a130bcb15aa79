"""What the flight recorder costs per collective (chapter 2, notebook 2.4): both settings in one process.

    torchrun --nproc-per-node 1 fr_overhead.py

How torch 2.15 reads the setting decides the design. gloo's own recorder reads `TORCH_FR_BUFFER_SIZE` once per
process, but every other backend (NCCL2, `nccl-lazy`, third-party ones) is recorded through a `FlightRecorderHook`
that `new_group` attaches only if `TORCH_FR_BUFFER_SIZE` (then `TORCH_NCCL_TRACE_BUFFER_SIZE`) is positive *when
the group is created*. So one process can hold two groups of one hooked backend, one created with the recorder on
and one with `TORCH_FR_BUFFER_SIZE=0`, and time them in alternating blocks: whatever the machine does meanwhile
falls on both alike. NCCL needs GPUs; the backend here is `Instant`, a CPU stand-in registered like any third-party
backend, whose collectives do nothing and complete at once, so the hook's work (the same recorder code NCCL2's
collectives go through) is all that differs between the two groups. Its ring (2000 entries) is filled first, as in
a long job.

What is timed is the CPU time of the issuing thread per call (`pt215.timing.thread_cpu_samples`: time the thread
spends waiting for a core on a loaded machine is not in it), at several depths of the Python stack, because the
recorder captures the stack of every collective it records. The control, in the same blocks:
`torch._C._profiler.gather_traceback(python=True, script=True, cpp=False)`, the capture the recorder makes for each
entry, timed on its own (`cpp=True`: with TORCH_FR_CPP_STACK=1), and the extra frames alone. The null control,
`--null`, creates both groups with the recorder off: their difference is then what the two groups differ by without
the recorder (the order of creation, the group's name), which must be small against the recorder's cost.

Reports per rank: {"entries" (in the ring at the end), "recorded_groups" (whose entries the ring holds), "on", "off",
"depths", and per depth, in microseconds per call (the median over --rounds blocks of --calls calls):
"all_reduce_on_us", "all_reduce_off_us", "capture_us", "capture_cpp_us", "frames_us"}.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
from torch._C._profiler import gather_traceback
from torch.futures import Future

from pt215.launch import init_rank, report, shutdown
from pt215.timing import thread_cpu_samples

BACKEND = "instant"


class Done(c10d.Work):
    """A collective that has already completed."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future:
        f: Future = Future()
        f.set_result(None)
        return f


class Instant(c10d.Backend):
    """A CPU backend whose all_reduce does nothing and completes at once: the recorder's hook is all that runs."""

    def getBackendName(self) -> str:  # noqa: N802 - the c10d Backend API
        return BACKEND

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:
        return Done()

    def barrier(self, opts: Any = None) -> Done:
        return Done()


def deep(depth: int, fn: Callable[[], Any]) -> Any:
    """Call `fn` under `depth` more Python frames (a model's forward, a wrapper, a hook ...)."""
    return fn() if depth <= 0 else deep(depth - 1, fn)


def new_group_with(buffer_size: str | None, ranks: list[int]) -> dist.ProcessGroup:
    """A group of the stand-in backend, created while TORCH_FR_BUFFER_SIZE is `buffer_size` (None: unset)."""
    saved = os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    if buffer_size is not None:
        os.environ["TORCH_FR_BUFFER_SIZE"] = buffer_size
    try:
        return dist.new_group(ranks, backend=BACKEND, group_desc="on" if buffer_size is None else "off")
    finally:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        if saved is not None:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", type=int, nargs="+", default=[0, 25, 50, 100], help="extra Python frames")
    p.add_argument("--calls", type=int, default=100, help="calls per timed block")
    p.add_argument("--rounds", type=int, default=15, help="timed blocks per depth and variant")
    p.add_argument("--null", action="store_true",
                   help="the null control: create the 'on' group with the recorder off too (an A/A comparison)")
    a = p.parse_args(argv)
    if any(d < 0 or d > 500 for d in a.depths) or len(set(a.depths)) < 2:
        p.error(f"--depths must be at least two different values in [0, 500], got {a.depths}")
    if a.calls < 10 or a.rounds < 3:
        p.error(f"--calls must be >= 10 and --rounds >= 3, got {a.calls} and {a.rounds}")
    dist.Backend.register_backend(BACKEND, lambda store, rank, size, timeout: Instant(rank, size), devices=["cpu"])
    me = init_rank("gloo")
    on_size = "0" if a.null else None  # --null: both groups alike, so on - off is what the two groups differ by
    groups = {"on": [new_group_with(on_size, [r]) for r in range(me.world)][me.rank],  # every rank creates every group
              "off": [new_group_with("0", [r]) for r in range(me.world)][me.rank]}
    x = torch.ones(256)
    for g in groups.values():
        for _ in range(2100):  # the "on" ring full (2000 entries): the steady state of a long job
            dist.all_reduce(x, group=g)

    def timed(fn: Callable[[], Any], depth: int) -> float:
        return thread_cpu_samples(lambda: deep(depth, fn), iters=1, calls=a.calls)[0] * 1e6

    variants: dict[str, Callable[[], Any]] = {
        "all_reduce_on_us": lambda: dist.all_reduce(x, group=groups["on"]),
        "all_reduce_off_us": lambda: dist.all_reduce(x, group=groups["off"]),
        "capture_us": lambda: gather_traceback(True, True, False),
        "capture_cpp_us": lambda: gather_traceback(True, True, True),
        "frames_us": lambda: None,  # the extra frames alone
    }
    cost: dict[str, dict[int, list[float]]] = {k: {d: [] for d in a.depths} for k in variants}
    for _ in range(a.rounds):
        for d in a.depths:
            for k, fn in variants.items():  # round-robin: a busy moment falls on every variant alike
                cost[k][d].append(timed(fn, d))
    trace = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False, backend=BACKEND))
    names = {k: dist.distributed_c10d._get_process_group_name(g) for k, g in groups.items()}
    out: dict[str, Any] = {"entries": len(trace["entries"]), "depths": a.depths, **names,
                           "recorded_groups": sorted({e["process_group"][0] for e in trace["entries"]})}
    for k, per_depth in cost.items():
        out[k] = [statistics.median(per_depth[d]) for d in a.depths]
    print(f"ring '{BACKEND}' holds {out['entries']} entries, of group(s) {out['recorded_groups']}")
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
