"""Pre-train the team's small mixture-of-experts model with FSDP2, one process per GPU (upgraded to torch 2.15).

    ./launch.sh                                                        # one node, one rank per GPU, NCCL
    torchrun --nproc-per-node 4 train.py --backend gloo --steps 20     # a CPU smoke test on 4 ranks

Every rank reads its share of a synthetic token stream (sample i goes to rank i % world), trains the model with
bf16 parameters (FSDP2 `fully_shard` per block, then the root), logs the global loss through a small CPU group,
checks its router's precision against an fp32 copy of the same weights (`--probe-every`), records one step's
communication (`--comm-debug-step`) and writes a DCP checkpoint every `--ckpt-every` steps. `--resume DIR`
continues from a checkpoint.

Upgraded to 2.15: the gradients' reduce dtype is a choice (`--reduce-dtype`; unset, 2.15 would reduce them in
fp32), router and norm weights can stay fp32 (`--keep-fp32 router,norm`), each rank binds its GPU (`device_id`),
and with `--hang-dump-after S` a step stuck for S seconds makes every rank write its flight-recorder dump to
TORCH_FR_DUMP_TEMP_FILE<rank>, on gloo too (torch's Python watchdog).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from comm_bytes import CommBytes
from torch.distributed import _watchdog
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from pt215.fsdp import MoEConfig, MoETransformer, keep_fp32_override, routing_flips, synthetic_batch
from pt215.launch import shutdown
from pt215.timing import Stopwatch

REDUCE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="nccl",
                   help="process-group backend: nccl (GPUs) or gloo (CPU); the legacy NCCL class's name to compare")
    p.add_argument("--steps", type=int, default=20, help="training steps (at most what the data allows)")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    p.add_argument("--samples", type=int, default=None, help="sequences in the dataset (default: steps x batch x ranks)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default="ckpt", help="where the DCP checkpoints go (one folder per step)")
    p.add_argument("--ckpt-every", type=int, default=0, help="write a checkpoint every N steps (0: never)")
    p.add_argument("--resume", default=None, help="a checkpoint folder to continue from")
    p.add_argument("--probe-every", type=int, default=0, help="router precision check every N steps (0: never)")
    p.add_argument("--comm-debug-step", type=int, default=-1, help="record this step's collectives (-1: none)")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    p.add_argument("--reduce-dtype", choices=sorted(REDUCE_DTYPES), default="bf16",
                   help="dtype of the gradient reduce-scatter (bf16: 2.14's bytes; fp32: twice the bytes)")
    p.add_argument("--keep-fp32", default="", help="parameter name prefixes kept in fp32, e.g. router,norm")
    p.add_argument("--hang-dump-after", type=float, default=0.0,
                   help="seconds a step may take before every rank writes its flight-recorder dump (0: off)")
    a = p.parse_args(argv)
    for name in ("steps", "batch", "seq"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.samples is not None and a.samples < 1:
        p.error(f"--samples must be >= 1, got {a.samples}")
    if not 0 <= a.hang_dump_after < a.timeout:
        p.error(f"--hang-dump-after must be >= 0 and below --timeout ({a.timeout:g} s), got {a.hang_dump_after:g}")
    return a


@dataclass
class Job:
    """What every rank holds: its place in the job, the sharded model, an fp32 copy for the probe, the optimizer."""

    rank: int
    world: int
    device: torch.device
    metrics: dist.ProcessGroup
    cfg: MoEConfig
    model: MoETransformer
    reference: MoETransformer
    optim: torch.optim.Optimizer


def build(a: argparse.Namespace, device: torch.device) -> Job:
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = dist.new_group(backend="gloo", group_desc="metrics")  # CPU scalars for the logs: no device sync
    cfg = MoEConfig()
    torch.manual_seed(a.seed)
    model = MoETransformer(cfg).to(device)
    reference = MoETransformer(cfg).to(device)  # an fp32 copy for the router probe, never trained
    mesh = init_device_mesh(device.type, (world,))
    keep, _ = keep_fp32_override(model, tuple(k for k in a.keep_fp32.split(",") if k))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPES[a.reduce_dtype],
                                  param_dtype_override_fn=keep)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optim = torch.optim.AdamW(model.parameters(), lr=a.lr)
    return Job(rank, world, device, metrics, cfg, model, reference, optim)


def my_batches(job: Job, a: argparse.Namespace) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches: samples rank, rank + world, ... of the dataset, `a.batch` at a time."""
    samples = a.samples if a.samples is not None else a.steps * a.batch * job.world
    per_rank = samples // (job.world * a.batch)  # every rank the same number of batches (the remainder is dropped)
    for i in range(min(per_rank, a.steps)):
        ids = [job.rank + job.world * (i * a.batch + j) for j in range(a.batch)]
        pairs = [synthetic_batch(job.cfg, 1, a.seq, seed=a.seed * 1_000_003 + s) for s in ids]
        yield torch.cat([t for t, _ in pairs]), torch.cat([y for _, y in pairs])


def router_flips(job: Job, tokens: torch.Tensor) -> float:
    """Share of tokens whose top-k experts differ from an fp32 copy of the same weights (every rank calls it)."""
    job.reference.load_state_dict(get_model_state_dict(job.model, options=StateDictOptions(full_state_dict=True)))
    with torch.no_grad():
        job.model(tokens)
        job.reference(tokens)
    pairs = zip(job.model.routing(), job.reference.routing(), strict=True)
    return statistics.fmean(routing_flips(low, high) for low, high in pairs)


def save(job: Job, step: int, ckpt_dir: str) -> str:
    model_sd, optim_sd = get_state_dict(job.model, job.optim)
    path = os.path.join(ckpt_dir, f"step{step}")
    # Readers of these checkpoints run 2.15; a 2.14 rollback reads a copy converted by strip_stride_metadata.
    dcp.save({"model": model_sd, "optim": optim_sd, "train": {"step": step}}, checkpoint_id=path)  # noqa: PT1507
    return path


def load(job: Job, path: str) -> int:
    model_sd, optim_sd = get_state_dict(job.model, job.optim)
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": 0}}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(job.model, job.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["train"]["step"])


def train_step(job: Job, tokens: torch.Tensor, targets: torch.Tensor, comm: CommBytes | None) -> torch.Tensor:
    """Forward, backward (inside `comm`, if given) and the optimizer step; returns the global mean loss."""
    if comm is not None:
        comm.__enter__()
    loss, ce = job.model.loss(tokens.to(job.device), targets.to(job.device))
    loss.backward()
    if comm is not None:
        comm.__exit__(None, None, None)
    job.optim.step()
    job.optim.zero_grad()
    mean = ce.detach().float().cpu().reshape(1)
    dist.all_reduce(mean, group=job.metrics)
    return mean / job.world


class HangDump:
    """Arms torch's Python watchdog around a step: after `seconds`, this rank writes its flight-recorder dump
    (`TORCH_FR_DUMP_TEMP_FILE` + rank, with Python frames), whether it waits in a collective or computes."""

    def __init__(self, seconds: float, rank: int, device: torch.device):
        self.seconds, self.rank, self.handle, self.fired = seconds, rank, None, False
        impl = type(dist.get_backend_impl(dist.group.WORLD, device)).__name__
        self.ring = {"ProcessGroupGloo": "gloo", "ProcessGroupNCCL2": "nccl2"}.get(impl)  # None: nccl-legacy

    def dump(self) -> None:
        if self.ring is None:  # the legacy ProcessGroupNCCL keeps its own recorder
            with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{self.rank}", "wb") as f:
                f.write(c10d._dump_nccl_trace(includeStackTraces=True))
        else:
            c10d._dump_fr_trace_file(self.rank, includeStackTraces=True, backend=self.ring)
        self.fired = True

    def arm(self) -> None:
        self.disarm()
        self.fired = False
        if self.seconds:
            self.handle = _watchdog.cpu_timeout(self.seconds, self.dump)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def train(job: Job, a: argparse.Namespace, start: int, watch: HangDump) -> tuple[int, float]:
    """The training loop from step `start`; returns (steps done, the last step's loss)."""
    probe = synthetic_batch(job.cfg, 32, a.seq, seed=999_999_937)[0].to(job.device)  # the same tokens every time
    done, last = start, float("nan")
    for step, (tokens, targets) in enumerate(my_batches(job, a)):
        if step < start:
            continue
        watch.arm()
        if a.probe_every and step % a.probe_every == 0:
            flips = router_flips(job, probe)
            if job.rank == 0:
                print(f"probe step {step} flips {flips:.4f}", flush=True)
        comm = CommBytes(job.model) if step == a.comm_debug_step else None
        with Stopwatch(job.device) as clock:
            last = train_step(job, tokens, targets, comm).item()
        watch.disarm()
        done = step + 1
        if job.rank == 0:
            note = " (first step)" if step == start else " (under CommDebugMode)" if comm is not None else ""
            print(f"step {step} loss {last:.4f} step_ms {clock.seconds * 1e3:.1f}{note}", flush=True)
            if comm is not None:
                print(f"comm step {step} {comm.summary()}", flush=True)
        if a.ckpt_every and done % a.ckpt_every == 0:
            path = save(job, done, a.ckpt_dir)
            if job.rank == 0:
                print(f"checkpoint {os.path.basename(path)} written", flush=True)
    return done, last


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if a.backend != "gloo":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout),
                            device_id=device if device.type == "cuda" else None)
    job = build(a, device)
    start = load(job, a.resume) if a.resume else 0
    watch = HangDump(a.hang_dump_after, job.rank, device)
    try:
        done, last = train(job, a, start, watch)
        steps = torch.tensor([float(done - start)])
        watch.arm()
        dist.all_reduce(steps, group=job.metrics)  # how many steps the ranks ran, together
        watch.disarm()
    except RuntimeError:  # a collective failed or timed out: leave a post-mortem, unless the watchdog did
        if a.hang_dump_after and not watch.fired:
            watch.dump()
        raise
    if job.rank == 0:
        print(f"final loss {last:.4f} after step {done} ({steps.item() / job.world:g} steps per rank)", flush=True)
    shutdown()  # the book's clean teardown: a barrier, every rank confirms, then destroy_process_group
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
