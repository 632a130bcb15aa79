"""Pipeline memory and communicators in 2.15, measured on gloo ranks (chapter 8, notebook 08-1)

    torchrun --nproc-per-node 4 pipeline_memory.py --budgets none,1,2

Each rank holds two stages of an 8-stage MLP (`ScheduleInterleaved1F1B`, interleaved: rank r holds stages r and
r+4). For every `max_outstanding_sends` value in `--budgets` it builds the schedule, runs `--steps` training
steps and records, per step, the peak bytes of receive buffers and stage outputs alive at once on this rank
(`pt215.pipeline.LiveBytes`), how many receive buffers were allocated, and the lowered schedule's actions. It
also reports the `unshard_lookahead` "full" and "auto" lowerings (where each rank's UNSHARD actions sit) and,
with `--per-edge`, the communicators `torch.distributed.config.pipeline_per_edge_p2p` creates.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

from pt215.launch import init_rank, report, shutdown
from pt215.pipeline import LiveBytes, action_counts, action_rows, track_pipeline_memory, unshard_positions

STAGES_PER_RANK = 2
LOWERING_STAGES_PER_RANK = 4


def parse_budgets(text: str) -> list[int | None]:
    """'none,1,2' -> [None, 1, 2] (None: no limit, the default)."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "none":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--budgets: expected 'none' or positive integers, got {part!r}")
    return out


DEVICE: torch.device | None = None  # the rank's device, set by main()


def build_stages(rank: int, world: int, dim: int) -> list[PipelineStage]:
    """Rank r holds stages r and r + world of a (world * 2)-stage MLP, each Linear + ReLU, seeded by stage."""
    n = world * STAGES_PER_RANK
    stages = []
    for index in (rank + k * world for k in range(STAGES_PER_RANK)):
        torch.manual_seed(index)
        block = nn.Sequential(nn.Linear(dim, dim), nn.ReLU()).to(DEVICE)
        stages.append(PipelineStage(block, index, n, DEVICE))
    return stages


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def measure(rank: int, world: int, args, budget: int | None) -> dict:
    """Run `args.steps` steps with `max_outstanding_sends=budget`; peak live bytes per step and action counts."""
    stages = build_stages(rank, world, args.dim)
    schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn, max_outstanding_sends=budget)
    rows = action_rows(schedule.pipeline_order_with_comms)
    torch.manual_seed(100)
    x = torch.randn(args.microbatches * args.mb_rows, args.dim, device=DEVICE)
    target = torch.randn_like(x)
    tracker = LiveBytes()
    steps = []
    with track_pipeline_memory(stages, tracker):
        for _ in range(args.steps):
            tracker.reset_peak()
            if rank == 0:
                schedule.step(x)
            elif rank == world - 1:
                schedule.step(target=target, losses=[])
            else:
                schedule.step()
            steps.append({"peak_bytes": tracker.peak, "peak_recv_bytes": tracker.peak_by_kind.get("recv", 0),
                          "recv_buffers": tracker.allocations.get("recv", 0),
                          "outputs": tracker.allocations.get("output", 0)})
    counts = action_counts({rank: rows[rank]}, ["SEND_F", "RECV_F", "SEND_B", "RECV_B", "WAIT_SEND_F",
                                                 "WAIT_SEND_B"])[rank]
    return {"budget": budget, "steps": steps, "counts": counts,
            "microbatch_bytes": args.mb_rows * args.dim * 4}


def lowerings(rank: int, world: int, args) -> dict:
    """Each rank's compute time slots (`pipeline_order`, idle slots "") and UNSHARD positions under unshard_lookahead 'full' and 'auto'.

    Uses 4 stages per rank and max_active_stages=4, so 'auto' resolves to min(rank + 2, 4) = 2, 3, 4, 4 on 4 ranks.
    """
    out = {}
    n = world * LOWERING_STAGES_PER_RANK
    for mode in ("full", "auto"):
        stages = [PipelineStage(nn.Linear(4, 4).to(DEVICE), index, n, DEVICE)
                  for index in range(rank, n, world)]
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn,
                                           max_active_stages=LOWERING_STAGES_PER_RANK, unshard_lookahead=mode)
        rows = action_rows(schedule.pipeline_order_with_comms)
        out[mode] = {"unshard_after": {str(r): p for r, p in unshard_positions(rows).items()},
                     "timeline": {str(r): ["" if a is None else str(a) for a in acts]
                                  for r, acts in sorted(schedule.pipeline_order.items())}}
    return out


def per_edge(rank: int, world: int, args) -> dict:
    """Turn on pipeline_per_edge_p2p, run one step, and list the directed edges and their communicators."""
    import torch.distributed.config as dist_config

    with dist_config.patch(pipeline_per_edge_p2p=True):
        stages = build_stages(rank, world, args.dim)
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn)
        x = torch.randn(args.microbatches * args.mb_rows, args.dim, device=DEVICE)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=torch.randn_like(x), losses=[])
        else:
            schedule.step()
        groups = stages[0]._p2p_edge_groups
        default = dist.distributed_c10d._get_default_group()
        return {"per_edge": bool(stages[0].p2p_per_edge),
                "edges": sorted([list(edge), dist.get_world_size(group), group is default]
                                for edge, group in groups.items()),
                "distinct_groups": len({id(g) for g in groups.values()})}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=parse_budgets, default=parse_budgets("none,1,2"),
                        help="comma-separated max_outstanding_sends values ('none' = no limit)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--mb-rows", type=int, default=64, help="rows per microbatch")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--per-edge", action="store_true", help="also run with pipeline_per_edge_p2p=True")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                        help="nccl runs the stages on cuda:LOCAL_RANK (one GPU per rank)")
    args = parser.parse_args(argv)
    for name in ("microbatches", "mb_rows", "dim", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    global DEVICE
    me = init_rank(args.backend, timeout_s=60)
    DEVICE = me.device
    if me.world < 2:
        parser.error("pipeline_memory.py needs at least 2 ranks (torchrun --nproc-per-node 4)")
    result = {"runs": [measure(me.rank, me.world, args, b) for b in args.budgets],
              "lowerings": lowerings(me.rank, me.world, args)}
    if args.per_edge:
        result["per_edge"] = per_edge(me.rank, me.world, args)
    report(result)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
