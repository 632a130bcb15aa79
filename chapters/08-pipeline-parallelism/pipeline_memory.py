"""Pipeline memory and communicators in 2.15, measured on gloo ranks (chapter 8, notebook 8.1)

    torchrun --nproc-per-node 4 pipeline_memory.py --per-edge

Each rank holds two stages of an 8-stage MLP (`ScheduleInterleaved1F1B`, interleaved: rank r holds stages r and
r+4), each stage a Linear followed by an activation: relu (autograd keeps the stage's output for the backward) or
gelu (it keeps the Linear's output instead, and the stage's output is free once sent). Each run of `--runs` names
the activation, the `max_outstanding_sends` budget and optionally `defer` (`defer_pp_recv=True`) and `no-return`
(`step(..., return_outputs=False)` on the last rank). For each it builds the schedule, runs `--steps` training
steps and records, per step, the peak bytes of receive buffers, stage outputs and sent input gradients whose
storage is alive at once on this rank (`pt215.pipeline.LiveStorage`), the bytes over the schedule's actions for the
last step, the same lifetimes rebuilt from the CPU allocator's events (`torch.profiler`,
`pt215.pipeline.allocator_check`), the lowered schedule and what lowering the budget moved. It also reports
`analyze_pipeline_activation_liveness` for this rank, (rank 0) the `unshard_lookahead` lowerings and what
`max_outstanding_sends=0` does, and with `--per-edge` the communicators `torch.distributed.config.pipeline_per_edge_p2p`
creates and when.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    ScheduleInterleaved1F1B,
    analyze_pipeline_activation_liveness,
)

from pt215.launch import init_rank, report, shutdown
from pt215.pipeline import (
    LiveStorage,
    action_rows,
    allocator_check,
    allocator_profile,
    compute_grid,
    track_pipeline_memory,
    transfers,
    unshard_positions,
)

STAGES_PER_RANK = 2
LOWERING_STAGES_PER_RANK = 4
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


# defer and no-return each in a run of its own, so that each run differs from relu/none in one setting
DEFAULT_RUNS = "relu/none,relu/1,gelu/none,gelu/2,gelu/1,relu/none/defer,relu/none/no-return"


def parse_runs(text: str) -> list[dict]:
    """'relu/none,gelu/2/defer' -> [{'act': 'relu', 'budget': None, ...}, ...] (act/budget[/defer][/no-return])."""
    runs = []
    for spec in text.split(","):
        parts = [p.strip().lower() for p in spec.split("/")]
        if len(parts) < 2 or parts[0] not in ACTIVATIONS or not (parts[1] == "none" or parts[1].isdigit()) \
                or (parts[1].isdigit() and int(parts[1]) < 1) or set(parts[2:]) - {"defer", "no-return"}:
            raise argparse.ArgumentTypeError(
                f"--runs: expected act/budget[/defer][/no-return] with act in {sorted(ACTIVATIONS)} and budget "
                f"'none' or a positive integer, got {spec!r}")
        runs.append({"act": parts[0], "budget": None if parts[1] == "none" else int(parts[1]),
                     "defer": "defer" in parts[2:], "return_outputs": "no-return" not in parts[2:]})
    return runs


DEVICE: torch.device | None = None  # the rank's device, set by main()


def build_stages(rank: int, world: int, dim: int, act: str = "relu") -> list[PipelineStage]:
    """Rank r holds stages r and r + world of a (world * 2)-stage MLP, each Linear + `act`, seeded by stage."""
    n = world * STAGES_PER_RANK
    stages = []
    for index in (rank + k * world for k in range(STAGES_PER_RANK)):
        torch.manual_seed(index)
        block = nn.Sequential(nn.Linear(dim, dim), ACTIVATIONS[act]()).to(DEVICE)
        stages.append(PipelineStage(block, index, n, DEVICE))
    return stages


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def step(schedule, rank: int, world: int, x: torch.Tensor, target: torch.Tensor, return_outputs: bool = True) -> None:
    """One training step; the last rank passes the target (and `return_outputs`), the first the input."""
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=target, losses=[], return_outputs=return_outputs)
    else:
        schedule.step()


def activation_slots(schedule, stages, pp_rank: int) -> int:
    """How many stage activations this rank holds at once, read from the schedule before it runs (2.15)."""
    plan = analyze_pipeline_activation_liveness(
        schedule, pp_rank=pp_rank, stage_indices=[s.stage_index for s in stages], granularity="stage_microbatch")
    return plan.num_slots


def measure(rank: int, world: int, args, act: str, budget: int | None, defer: bool = False,
            return_outputs: bool = True, first: bool = False) -> dict:
    """`args.steps` steps with `max_outstanding_sends=budget`: per step the peak live bytes, and for the last step
    the bytes over the schedule's actions and the allocator's view of the same storages. The `first` run also
    reports the compute grid and the activation liveness analysis."""
    stages = build_stages(rank, world, args.dim, act)
    with budget_log() as moved:
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn,
                                           max_outstanding_sends=budget, defer_pp_recv=defer)
    rows = action_rows(schedule.pipeline_order_with_comms)
    torch.manual_seed(100)
    x = torch.randn(args.microbatches * args.mb_rows, args.dim, device=DEVICE)
    target = torch.randn_like(x)
    tracker = LiveStorage()
    steps = []
    profiler = allocator_profile() if args.control else contextlib.nullcontext()
    with track_pipeline_memory(stages, tracker), profiler as prof:
        for _ in range(args.steps):
            tracker.reset_peak()
            step(schedule, rank, world, x, target, return_outputs)
            steps.append({"peak_bytes": tracker.peak, "peak_recv_bytes": tracker.peak_by_kind.get("recv", 0),
                          "peak_output_bytes": tracker.peak_by_kind.get("output", 0),
                          "peak_grad_bytes": tracker.peak_by_kind.get("grad", 0),
                          "recv_buffers": tracker.allocations.get("recv", 0),
                          "outputs": tracker.allocations.get("output", 0)})
    check = allocator_check(prof, tracker) if args.control else None
    out = {"act": act, "budget": budget, "defer_pp_recv": defer, "return_outputs": return_outputs, "steps": steps,
           "events": list(tracker.events), "lowered": rows[rank], "transfers": transfers(rows)[rank],
           "budget_moves": moved.get(rank, {}), "microbatch_bytes": args.mb_rows * args.dim * 4}
    if check is not None:
        out["control"] = {"peak_bytes": check.peak, "tracker_peak_bytes": check.tracker_peak,
                          "matched": check.matched, "unmatched": check.unmatched, "moved": check.moved,
                          "step_peak_bytes": check.step_peak, "agrees": check.agrees}
    if first:
        out["grid"] = compute_grid(schedule.pipeline_order)
        out["activation_slots"] = activation_slots(schedule, stages, rank)
        plan = analyze_pipeline_activation_liveness(schedule, pp_rank=rank, granularity="microbatch",
                                                    stage_indices=[s.stage_index for s in stages])
        out["microbatch_slots"] = plan.num_slots
        out["lifetime_first"] = list(plan.get_activation_lifetime(stages[0].stage_index, 0))
    return out


@contextlib.contextmanager
def budget_log():
    """Collect what lowering a send budget logs per pipeline rank: waits moved and how many of them may stall."""
    log = logging.getLogger("torch.distributed.pipelining.schedules")
    moved: dict[int, dict[str, int]] = {}

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.msg.startswith("Pipeline rank %d send budget"):
                rank, _budget, peak, mf, mb, sf, sb = record.args
                moved[rank] = {"peak_pending": peak, "moved": mf + mb, "may_stall": sf + sb}

    handler, level = Handler(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield moved
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def budget_errors(rank: int, world: int, args) -> dict:
    """What building the schedule says for max_outstanding_sends=0 and -1 (the message, or 'accepted')."""
    out = {}
    for budget in (0, -1):
        try:
            ScheduleInterleaved1F1B(build_stages(rank, world, 8), args.microbatches, loss_fn=loss_fn,
                                    max_outstanding_sends=budget)
            out[str(budget)] = "accepted"
        except ValueError as e:
            out[str(budget)] = str(e)
    return out


def lowerings(rank: int, world: int, args) -> dict:
    """Each rank's compute grid and UNSHARD positions under unshard_lookahead 'full', 'auto' and a per-rank tuple.

    Uses 4 stages per rank and max_active_stages=4, so 'auto' resolves to min(rank + 2, 4) = 2, 3, 4, 4 on 4 ranks.
    """
    out: dict = {}
    n = world * LOWERING_STAGES_PER_RANK
    policies = {"full": "full", "auto": "auto", "tuple": tuple([1] * world)}
    for name, policy in policies.items():
        stages = [PipelineStage(nn.Linear(4, 4).to(DEVICE), index, n, DEVICE) for index in range(rank, n, world)]
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn,
                                           max_active_stages=LOWERING_STAGES_PER_RANK, unshard_lookahead=policy)
        rows = action_rows(schedule.pipeline_order_with_comms)
        out[name] = {"unshard_after": {str(r): p for r, p in unshard_positions(rows).items()},
                     "grid": {str(r): row for r, row in compute_grid(schedule.pipeline_order).items()},
                     "rows": {str(r): row for r, row in rows.items()}}
    try:
        stages = [PipelineStage(nn.Linear(4, 4).to(DEVICE), index, n, DEVICE) for index in range(rank, n, world)]
        ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn,
                                max_active_stages=LOWERING_STAGES_PER_RANK, unshard_lookahead=(2, 3))
        out["short_tuple"] = "accepted"
    except ValueError as e:
        out["short_tuple"] = str(e)
    return out


def per_edge(rank: int, world: int, args) -> dict:
    """Turn on pipeline_per_edge_p2p; list the edge communicators before and after the first step."""
    import torch.distributed.config as dist_config

    with dist_config.patch(pipeline_per_edge_p2p=True):
        stages = build_stages(rank, world, args.dim)
        schedule = ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss_fn)
        before = len(stages[0]._p2p_edge_groups)
        x = torch.randn(args.microbatches * args.mb_rows, args.dim, device=DEVICE)
        step(schedule, rank, world, x, torch.randn_like(x))
        groups = stages[0]._p2p_edge_groups
        default = dist.distributed_c10d._get_default_group()
        return {"per_edge": bool(stages[0].p2p_per_edge), "groups_before_first_step": before,
                "edges": sorted([list(edge), dist.get_world_size(group), group is default]
                                for edge, group in groups.items()),
                "distinct_groups": len({id(g) for g in groups.values()})}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=parse_runs, default=parse_runs(DEFAULT_RUNS),
                        help="comma-separated runs act/budget[/defer][/no-return]: act relu (output kept by "
                             "autograd) or gelu (not), budget max_outstanding_sends ('none' = no limit), defer: "
                             "defer_pp_recv=True, no-return: return_outputs=False on the last rank "
                             f"(default {DEFAULT_RUNS})")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--mb-rows", type=int, default=64, help="rows per microbatch")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the allocator control (torch.profiler's memory events)")
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
    runs = [measure(me.rank, me.world, args, r["act"], r["budget"], r["defer"], r["return_outputs"], first=i == 0)
            for i, r in enumerate(args.runs)]
    result: dict = {"runs": runs}
    if me.rank == 0:  # every rank lowers the same schedules; one report of them is enough
        result["lowerings"] = lowerings(me.rank, me.world, args)
        result["budget_errors"] = budget_errors(me.rank, me.world, args)
    if args.per_edge:
        result["per_edge"] = per_edge(me.rank, me.world, args)
    report(result)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
