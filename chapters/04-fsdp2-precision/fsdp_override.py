"""Chapter 4: the per-parameter precision override, one all-gather per unit, and the reduce-scatter dtype.

Run:  torchrun --nproc-per-node 2 fsdp_override.py                    (gloo on CPU)
      torchrun --nproc-per-node 2 fsdp_override.py --backend nccl     (2+ CUDA GPUs)
Every rank asserts what it checks; rank 0 prints. Results go back through pt215.launch.report.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    fsdp_units,
    install_comm_counters,
    keep_fp32_override,
    record_forward_dtypes,
    shard_model,
    synthetic_batch,
)
from pt215.launch import init_rank, report, shutdown

BF16 = torch.bfloat16


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    me = init_rank(ap.parse_args(argv).backend, timeout_s=60)
    rank, device = me.rank, me.device
    cfg = MoEConfig()
    out: dict = {}

    def say(*a):
        if rank == 0:
            print(*a)

    def build() -> MoETransformer:
        torch.manual_seed(0)  # identical initial weights on every rank and in every variant
        return MoETransformer(cfg).to(device)

    x, y = (t.to(device) for t in synthetic_batch(cfg, batch=4, seq=16, seed=100 + rank))  # own shard per rank

    # ---- 1. what the override may return: anything but None / param_dtype / the original dtype is refused
    say("== wrong returns from param_dtype_override_fn (raised inside fully_shard, before any communication)")
    errors = {}
    for label, bad in [("torch.float16", lambda p: torch.float16), ("the string 'float32'", lambda p: "float32")]:
        try:
            shard_model(build(), MixedPrecisionPolicy(param_dtype=BF16, param_dtype_override_fn=bad))
            errors[label] = "no error"
        except ValueError as e:
            errors[label] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        say(f"  returns {label}:\n    {errors[label]}")
    out["errors"] = errors

    # ---- 2. the override: router + norm weights fp32, everything else bf16
    model = build()
    fn, kept = keep_fp32_override(model, keep=("router", "norm"))
    say(f"== kept in fp32 by the override ({len(kept)} parameters): {', '.join(kept)}")
    shard_model(model, MixedPrecisionPolicy(param_dtype=BF16, param_dtype_override_fn=fn))
    units = list(fsdp_units(model))
    log = install_comm_counters(model)
    table, hooks = record_forward_dtypes(model)
    loss, _ = model.loss(x, y)
    fwd_count, fwd_dtypes = log.count("all_gather"), log.dtypes("all_gather")
    fwd_bytes = {r.unit: r.nbytes for r in log.records}
    for h in hooks:
        h.remove()

    say("== dtype of each module's parameters (and first input) inside forward, seen by forward pre-hooks")
    for mod, row in table.items():
        if mod.startswith("blocks.1"):
            continue  # block 1 is identical to block 0
        say(f"  {mod:26s} " + "  ".join(f"{k}={v}" for k, v in row.items()))
    for mod, row in table.items():
        for pname, dt in row.items():
            if pname == "__input":
                continue
            expect = "float32" if f"{mod}.{pname}" in kept else "bfloat16"
            assert dt == expect, (mod, pname, dt, expect)
    say(f"== all-gathers in one forward, per unit: {fwd_count}")
    say(f"   all-gather input dtypes: {fwd_dtypes}")
    assert sorted(fwd_count) == sorted(units) and all(c == 1 for c in fwd_count.values()), fwd_count
    assert all(d == ["uint8"] for d in fwd_dtypes.values()), fwd_dtypes
    loss.backward()
    say(f"== after backward too: {log.count('all_gather')} (blocks re-gather: reshard_after_forward=True)")
    out["override"] = {"fwd_count": fwd_count, "fwd_dtypes": fwd_dtypes, "fwd_bytes": fwd_bytes,
                       "kept": kept, "table": table}

    # ---- the same model, all bf16: one all-gather per unit too, but the buffer is plain bfloat16
    plain = build()
    shard_model(plain, MixedPrecisionPolicy(param_dtype=BF16))
    plog = install_comm_counters(plain)
    plain.loss(x, y)
    p_count, p_dtypes = plog.count("all_gather"), plog.dtypes("all_gather")
    p_bytes = {r.unit: r.nbytes for r in plog.records}
    assert all(c == 1 for c in p_count.values()) and all(d == ["bfloat16"] for d in p_dtypes.values())
    say(f"== all-bf16 policy: all-gathers {p_count}, dtypes {p_dtypes}")
    say("   bytes each rank contributes per all-gather (override vs all-bf16):")
    for u in units:
        say(f"   {u:9s} {fwd_bytes[u]:7d} vs {p_bytes[u]:7d}  (+{fwd_bytes[u] - p_bytes[u]} B)")
    out["plain"] = {"fwd_count": p_count, "fwd_dtypes": p_dtypes, "fwd_bytes": p_bytes}

    # ---- 3. the 2.15 reduce_dtype=None change, and per-parameter grad_dtype
    say("== reduce-scatter input dtype per unit, and the sharded .grad dtypes")

    def reduce_run(policy: MixedPrecisionPolicy, grad_dtype_for=None, stored=None,
                   grad_dtype: torch.dtype | None = BF16) -> tuple[dict, dict, int]:
        m = build() if stored is None else build().to(stored)  # stored: the dtype the parameters are kept in
        shard_model(m, policy)
        if grad_dtype_for is not None:  # per-parameter grad_dtype: set on the sharded parameter, before 1st forward
            for name, p in m.named_parameters():
                if grad_dtype_for(name):
                    p.grad_dtype = grad_dtype
        lg = install_comm_counters(m)
        m.loss(x, y)[0].backward()
        grads = {}
        for name, p in m.named_parameters():
            grads.setdefault(str(p.grad.dtype).replace("torch.", ""), []).append(name)
        rs_bytes = sum(r.nbytes for r in lg.records if r.kind == "reduce_scatter")
        return lg.dtypes("reduce_scatter"), {k: len(v) for k, v in grads.items()}, rs_bytes

    modes = {
        "param_dtype=bf16, reduce_dtype=None (2.15 default)": (MixedPrecisionPolicy(param_dtype=BF16), None),
        "param_dtype=bf16, reduce_dtype=bf16 (old behaviour)": (
            MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16), None),
        "reduce_dtype=None, experts' grad_dtype=bf16": (
            MixedPrecisionPolicy(param_dtype=BF16), lambda n: ".experts." in n),
        "reduce_dtype=None, all of blocks.0 grad_dtype=bf16": (
            MixedPrecisionPolicy(param_dtype=BF16), lambda n: n.startswith("blocks.0.")),
    }
    stored = "parameters stored in bf16 (model.to(bf16) before fully_shard), reduce_dtype=None"
    modes[stored] = (modes["param_dtype=bf16, reduce_dtype=None (2.15 default)"][0], None)  # the same policy
    # an explicit grad_dtype = None ("accept any incoming gradient dtype"): no accumulation dtype, so the
    # reduction follows the dtype the gradient arrives in, here param_dtype's bf16
    explicit_none = "reduce_dtype=None, grad_dtype=None set on every parameter"
    modes[explicit_none] = (MixedPrecisionPolicy(param_dtype=BF16), lambda n: True)
    rs = {}
    for label, (policy, sel) in modes.items():
        dts, grads, nbytes = reduce_run(policy, sel, BF16 if label == stored else None,
                                        None if label == explicit_none else BF16)
        rs[label] = {"reduce_scatter": dts, "grad_dtypes": grads, "bytes": nbytes}
        say(f"  {label}\n    reduce-scatter: {dts}, {nbytes} B in per rank per step\n"
            f"    sharded .grad dtypes (count of params): {grads}")
    out["reduce"] = rs
    first = list(rs.values())
    assert all(v == ["float32"] for v in first[0]["reduce_scatter"].values())
    assert all(v == ["bfloat16"] for v in first[1]["reduce_scatter"].values())
    assert first[2]["reduce_scatter"]["blocks.0"] == ["float32"] and first[2]["grad_dtypes"]["bfloat16"] == 4
    assert first[3]["reduce_scatter"]["blocks.0"] == ["bfloat16"] and first[3]["reduce_scatter"]["root"] == ["float32"]
    assert all(v == ["bfloat16"] for v in first[4]["reduce_scatter"].values()) and first[4]["bytes"] == first[1]["bytes"]
    assert all(v == ["bfloat16"] for v in first[5]["reduce_scatter"].values()) and first[5]["bytes"] == first[1]["bytes"]

    # ---- 4. one mixed all-gather buffer, byte by byte: a tiny unit with a bf16-gathered weight and an fp32 scale
    out["tiny"] = tiny_unit_bytes(device)
    say(f"== a tiny unit's all-gather: {out['tiny']['dtype']} buffer, {len(out['tiny']['gathered'])} bytes gathered; "
        f"this rank sent {len(out['tiny']['sent'])}")

    # ---- 5. in your own job: torch's CommDebugMode counts the same collectives, without pt215's counters
    m = build()
    fn5, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32, param_dtype_override_fn=fn5))
    lg = install_comm_counters(m)
    counts = comm_debug_counts(lambda: m.loss(x, y)[0].backward())
    book = {"all_gather": sum(lg.count("all_gather").values()), "reduce_scatter": sum(lg.count("reduce_scatter").values())}
    out["comm_debug"] = {"comm_debug_mode": counts, "pt215": book}
    say(f"== CommDebugMode, one training step with the override: {counts}; pt215's counters: {book}")
    assert counts == {"c10d._allgather_base_": book["all_gather"],
                      "c10d._reduce_scatter_base_": book["reduce_scatter"]}, (counts, book)

    # ---- 6. chapter 1's busbw on this backend, at the size of this model's fp32 gradient (the calculator's input)
    from pt215.bench import bus_bandwidth, time_collective

    world = torch.distributed.get_world_size()
    sec, used, ok = time_collective("reduce_scatter", first[0]["bytes"], warmup=3, iters=10, device=device)
    out["busbw"] = {"bytes": used, "seconds": sec, "gbps": bus_bandwidth("reduce_scatter", used, sec, world),
                    "correct": ok, "world": world}

    # nn.Parameter.grad_dtype on a plain parameter
    say(f"== nn.Parameter(torch.zeros(2)).grad_dtype = {nn.Parameter(torch.zeros(2)).grad_dtype}")
    report(out)
    shutdown()
    return 0


def comm_debug_counts(step) -> dict[str, int]:
    """The lines a reader puts around a training step: torch's CommDebugMode counts every c10d collective."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        step()
    return {str(op): n for op, n in comm.get_comm_counts().items()}


def tiny_unit_bytes(device: torch.device) -> dict:
    """Shard a 2-parameter unit (a 4x2 weight gathered in bf16, a 4-element norm scale kept in fp32), gather it once
    and return its all-gather's bytes with what is needed to read them back (names, dtypes, shard sizes, values)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pt215.fsdp import RMSNorm

    tiny = nn.Module()
    tiny.proj = nn.Linear(2, 4, bias=False)
    tiny.norm = RMSNorm(4)
    with torch.no_grad():
        tiny.proj.weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25], [2.0, -4.0]]))
        tiny.norm.weight.copy_(torch.tensor([1.0, 1.5, 0.75, 2.0]))
    full = {n: p.detach().to(torch.float32 if "norm" in n else BF16).float().flatten().tolist()
            for n, p in tiny.named_parameters()}
    fn, _ = keep_fp32_override(tiny, keep=("norm",))
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    fully_shard(tiny.to(device), mesh=mesh,
                mp_policy=MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32, param_dtype_override_fn=fn))
    shards = [(n, "float32" if n == "norm.weight" else "bfloat16", p.to_local().numel())
              for n, p in tiny.named_parameters()]
    log = install_comm_counters(tiny, keep_bytes=True)
    tiny.unshard()                              # one all-gather, as FSDP2's pre-forward hook would issue
    tiny.reshard()
    (rec,) = log.records
    return {"dtype": rec.dtype, "sent": rec.sent, "gathered": rec.gathered, "shards": shards, "full": full}


if __name__ == "__main__":
    raise SystemExit(main())
