"""Chapter 4: does keeping router + norm weights in fp32 matter? A controlled experiment, and what it costs.

Three copies of the same MoE transformer (same seed, same data, same optimizer), sharded with fully_shard:
  fp32      no mixed precision (the reference)
  bf16      MixedPrecisionPolicy(param_dtype=bf16)
  override  the same plus param_dtype_override_fn keeping router and norm weights fp32
Their training steps are interleaved, so step times are measured side by side under the same load.

Run:  torchrun --nproc-per-node 2 fsdp_experiment.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.cpu_kernels import kernel_value
from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    expert_load,
    install_comm_counters,
    keep_fp32_override,
    routing_flips,
    shard_model,
    synthetic_batch,
)
from pt215.launch import init_rank, report, shutdown
from pt215.timing import Stopwatch

BF16 = torch.bfloat16
NAMES = ("fp32", "bf16", "override")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", type=Path, help="rank 0 also writes the results (what it reports) to this JSON file")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error(f"--steps must be >= 1, got {a.steps}")

    me = init_rank("gloo", timeout_s=60)
    rank, world, device = me.rank, me.world, me.device
    cfg = MoEConfig(dim=a.dim, n_experts=a.experts, hidden=2 * a.dim)

    def build(name: str):
        torch.manual_seed(0)
        m = MoETransformer(cfg)
        if name == "fp32":
            policy = MixedPrecisionPolicy()
        elif name == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=BF16)
        else:
            fn, _ = keep_fp32_override(m)
            policy = MixedPrecisionPolicy(param_dtype=BF16, param_dtype_override_fn=fn)
        shard_model(m, policy)
        log = install_comm_counters(m)
        return m, torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=0.0), log

    runs = {n: build(n) for n in NAMES}
    hist = {n: {"ce": [], "aux": [], "imbalance": [], "flips_vs_fp32": [], "time_s": []} for n in NAMES}
    final_load = {}
    bytes_per_step = {}
    for step in range(a.steps):
        x, y = synthetic_batch(cfg, batch=4, seq=32, seed=1000 * step + rank)
        routes = {}
        for name in NAMES:  # interleaved: same batch, same moment, for all three
            model, opt, log = runs[name]
            log.clear()
            with Stopwatch(device) as sw:
                loss, ce = model.loss(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            dt = sw.seconds
            routes[name] = model.routing()
            loads = [expert_load(i, cfg.n_experts) for i in routes[name]]
            stats = torch.tensor([ce.item(), model.aux_loss().item(),
                                  sum(float(ld.max() * cfg.n_experts) for ld in loads) / len(loads)])
            dist.all_reduce(stats, op=dist.ReduceOp.AVG)
            h = hist[name]
            h["ce"].append(stats[0].item())
            h["aux"].append(stats[1].item())
            h["imbalance"].append(stats[2].item())
            h["time_s"].append(dt)
            if step == a.steps - 1:
                final_load[name] = [expert_load(i, cfg.n_experts).tolist() for i in routes[name]]
            if step == 0:
                bytes_per_step[name] = {k: sum(r.nbytes for r in log.records if r.kind == k)
                                        for k in ("all_gather", "reduce_scatter")}
        for name in NAMES:
            f = torch.tensor([sum(routing_flips(r, r0) for r, r0 in zip(routes[name], routes["fp32"], strict=True))
                              / cfg.n_layers])
            dist.all_reduce(f, op=dist.ReduceOp.AVG)
            hist[name]["flips_vs_fp32"].append(f.item())
        f = torch.tensor([sum(routing_flips(r, r0) for r, r0 in zip(routes["bf16"], routes["override"], strict=True))
                          / cfg.n_layers])
        dist.all_reduce(f, op=dist.ReduceOp.AVG)
        hist.setdefault("bf16_vs_override", []).append(f.item())

    # how far the fp32 master copies of the norm weights moved from 1.0, against bf16's spacing near 1.0
    drift = {}
    for name in NAMES:
        model = runs[name][0]
        ws = [p.full_tensor() for n, p in model.named_parameters() if n.endswith("norm1.weight")
              or n.endswith("norm2.weight") or n == "norm.weight"]
        w = torch.cat(ws)  # started at 1.0; what a bf16 forward copy loses of the learned change:
        drift[name] = {"mean_abs_change": (w - 1).abs().mean().item(),
                       "mean_abs_bf16_rounding": (w.to(BF16).float() - w).abs().mean().item()}

    if rank == 0:
        for name in NAMES:
            h = hist[name]
            # After step 0 the bf16 trajectories diverge by CPU kernel (pt215.cpu_kernels): those digits carry '≈'.
            mean_flips = sum(h["flips_vs_fp32"]) / a.steps
            print(f"{name:9s} ce step0 {h['ce'][0]:.2f} -> last {kernel_value(h['ce'][-1])} | routing flips vs fp32: "
                  f"step0 {kernel_value(h['flips_vs_fp32'][0], '.2f', percent=True)}, "
                  f"mean {kernel_value(mean_flips, '.2f', percent=True)} | "
                  f"max expert load / fair share (last) {kernel_value(h['imbalance'][-1], '.2f')}")
    results = {"cfg": {"steps": a.steps, "experts": cfg.n_experts, "dim": cfg.dim, "lr": a.lr, "world": world},
               "hist": hist, "final_load": final_load, "bytes_per_step": bytes_per_step, "drift": drift}
    if rank == 0 and a.out is not None:
        provenance = {"torch": torch.__version__, "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
                      "command": "torchrun --nproc-per-node " + f"{world} fsdp_experiment.py " + " ".join(
                          str(x) for x in (argv if argv is not None else sys.argv[1:]))}
        tmp = a.out.with_name(a.out.name + ".tmp")
        tmp.write_text(json.dumps({**results, "provenance": provenance}, indent=1) + "\n", encoding="utf-8")
        tmp.replace(a.out)
    report(results)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
