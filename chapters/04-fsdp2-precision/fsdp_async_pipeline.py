"""Chapter 4, notebook 4.3: overlapped gradient reduction and pipeline accumulation with FSDP2 stages (gloo, CPU).

Part A (all ranks, one data-parallel group): N microbatches with gradient sync off, then
`FSDPModule.finalize_backward(async_op=True)` returns a `GradientReductionHandle`; the rank does other work
and calls `handle.wait()` before it reads `.grad`. The finalization, the other work and the wait run under
`torch.profiler`, and every rank reports the spans of its trace (`pt215.fsdp.profile_spans`): where the
reduce-scatters ran relative to the other work.

Part B (ranks split into 2 pipeline stages x data-parallel groups): each stage is a `fully_shard` unit on its
data-parallel mesh, driven by `ScheduleGPipe`. Calls of `schedule.step(..., finalize_gradients=False)`
accumulate gradients without reduce-scatters; the last call with `finalize_gradients=True` reduces once.

Run:  torchrun --nproc-per-node 4 fsdp_async_pipeline.py [--micro 3]     (world size must be even)
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, GradientReductionHandle, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.profiler import record_function

from pt215.fsdp import profile_spans
from pt215.launch import init_rank, report, shutdown

DIM = 32


class Counting(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.calls += 1
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def mlp(seed: int, layers: int = 2) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(DIM, DIM), nn.Tanh())])


def full_grads(model: nn.Module) -> torch.Tensor:
    """All gradients gathered to full tensors and flattened (a collective: every rank of the mesh calls it)."""
    return torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()])


def part_a(rank: int, world: int, micro: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    batches = [torch.randn(4, DIM, generator=torch.Generator().manual_seed(100 * i + rank)) for i in range(micro)]

    # reference: gradients synchronised in every backward
    ref = fully_shard(mlp(0), mesh=mesh)
    for x in batches:
        ref(x).square().mean().backward()
    g_ref = full_grads(ref)

    model = fully_shard(mlp(0), mesh=mesh)
    rs = Counting()
    model.set_custom_reduce_scatter(rs)
    model.set_manual_backward_finalization(True)
    model.set_requires_gradient_sync(False)
    for x in batches:
        model(x).square().mean().backward()
    during = rs.calls
    model.set_requires_gradient_sync(True)
    seen: dict = {}

    def finalize_overlap_wait() -> None:
        with record_function("finalize_backward(async_op=True)"):
            handle = model.finalize_backward(async_op=True)
        seen["returned"] = rs.calls                 # reduce-scatters issued by the time it returned
        with record_function("other work"):         # any work that does not touch the model
            seen["other"] = sum(float(torch.randn(256, 256).norm()) for _ in range(8))
        try:  # a second finalization before wait() is refused
            model.finalize_backward()
            seen["second"] = "accepted"
        except RuntimeError as e:
            seen["second"] = f"RuntimeError: {e}"
        with record_function("handle.wait()"):
            handle.wait()
        seen["handle"] = isinstance(handle, GradientReductionHandle)

    spans = profile_spans(finalize_overlap_wait, marks=("finalize", "other", "handle"))
    err = float((full_grads(model) - g_ref).abs().max())
    return {"handle": seen["handle"], "rs_during_backward": during, "rs_after_finalize": rs.calls,
            "rs_when_finalize_returned": seen["returned"], "second_finalize": seen["second"], "max_grad_diff": err,
            "other_work_done": seen["other"] > 0, "spans": [dataclasses.asdict(s) for s in spans]}


def part_b(rank: int, world: int, micro: int, n_microbatches: int = 2) -> dict:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp"))
    stage_idx = mesh.get_local_rank("pp")
    dp = mesh["dp"]
    pp_group = mesh.get_group("pp")
    dp_rank = dp.get_local_rank()
    inputs = [torch.randn(4, DIM, generator=torch.Generator().manual_seed(100 * i + dp_rank)) for i in range(micro)]
    targets = [torch.randn(4, DIM, generator=torch.Generator().manual_seed(100 * i + dp_rank + 50))
               for i in range(micro)]

    def build(finalize_each: bool) -> tuple[FSDPModule, Counting, list[dict | None]]:
        stage_mod = fully_shard(mlp(10 + stage_idx), mesh=dp)
        rs = Counting()
        stage_mod.set_custom_reduce_scatter(rs)
        stage = PipelineStage(stage_mod, stage_idx, 2, torch.device("cpu"), group=pp_group)
        # scale_grads=False: both variants then hold the plain sum of every microbatch's gradient (with True,
        # each finalizing call divides what it reduces by n_microbatches, so the two variants would differ)
        sched = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=nn.functional.mse_loss,
                              scale_grads=False)
        per_call = []
        for i in range(micro):
            last = i == micro - 1
            before = rs.calls
            kw = {"target": targets[i]} if stage_idx == 1 else {}
            args = (inputs[i],) if stage_idx == 0 else ()
            sched.step(*args, **kw, finalize_gradients=finalize_each or last)
            per_call.append(rs.calls - before)
        return stage_mod, rs, per_call

    each, _, calls_each = build(True)
    g_each = full_grads(each)
    deferred, _, calls_deferred = build(False)
    g_def = full_grads(deferred)
    return {"stage": stage_idx, "rs_per_step_finalize_each": calls_each,
            "rs_per_step_deferred": calls_deferred, "max_grad_diff": float((g_def - g_each).abs().max())}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", type=int, default=3, help="microbatches (part A) / step() calls (part B)")
    a = ap.parse_args(argv)
    if a.micro < 1:
        ap.error(f"--micro must be >= 1, got {a.micro}")
    me = init_rank("gloo", timeout_s=60)
    rank, world = me.rank, me.world
    if world % 2:
        raise SystemExit(f"fsdp_async_pipeline.py needs an even world size, got {world}")
    out = {"A": part_a(rank, world, a.micro)}
    dist.barrier()
    out["B"] = part_b(rank, world, a.micro)
    report(out)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
