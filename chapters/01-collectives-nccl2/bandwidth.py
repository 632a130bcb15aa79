"""busbw against the machine's own limit, in one run (chapter 1, notebook 1.3).

    torchrun --nproc-per-node 2 bandwidth.py                                  # gloo on CPU
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl -e 1G --copy-bytes 1G
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl-legacy -e 1G --copy-bytes 1G

1. pt215.bench.sweep: the nccl-tests method (check, warm-up, timed back-to-back iterations, mean over ranks)
2. at the largest size, `--rounds` rounds of three arms, the order rotating from round to round so that a
   busy moment of the machine falls on all of them alike:
   - the helper, `pt215.bench.time_collective`, on the all_reduce;
   - `your_busbw`: the same measurement in plain torch, the lines a reader copies into their own job (the
     control: its busbw must agree with the helper's);
   - the copy limit, `pt215.roofline.copy_step` of `--copy-bytes` on every rank at once (the memory the
     collective moves). A copy of n bytes is counted as 2n (read + write); moving n payload bytes is one such
     copy, so the ceiling busbw is compared with is copy / 2, the payload rate. busbw and the ceiling are the
     medians over the same rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215 import bench, links
from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_step
from pt215.timing import median_seconds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo")
    p.add_argument("--op", nargs="+", default=["all_reduce"], choices=bench.OPS)
    p.add_argument("-b", "--min-bytes", type=bench.parse_size, default="4K")
    p.add_argument("-e", "--max-bytes", type=bench.parse_size, default="16M")
    p.add_argument("-f", "--factor", type=int, default=4)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("--copy-bytes", type=bench.parse_size, default="128M",
                   help="size of the copy-bandwidth measurement (larger than the collective's buffers)")
    p.add_argument("--rounds", type=int, default=10,
                   help="rounds of helper, hand-timed loop and copy at the largest size, interleaved")
    return p


def your_busbw(nbytes: int, device: torch.device, iters: int = 10, warmup: int = 3) -> float:
    """all_reduce busbw in GB/s on the default group, the nccl-tests way, in plain torch (no pt215)."""
    x, n = torch.ones(nbytes // 4, device=device), dist.get_world_size()
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(x)
    wait()
    dist.barrier()
    start = time.monotonic()
    for _ in range(iters):  # issued back to back, the device synchronized once at the end
        dist.all_reduce(x)
    wait()
    t = torch.tensor([(time.monotonic() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # the mean time over ranks, as nccl-tests reports it
    return x.numel() * 4 / (t.item() / n) * 2 * (n - 1) / n / 1e9


def link_ceiling(n: int, device: torch.device) -> dict | None:
    """busbw's ceiling on GPUs: the link between them (NVLink or PCIe, per direction), not the HBM copy."""
    if device.type != "cuda":
        return None
    try:
        return links.link_peak(n, torch.cuda.get_device_capability(device)).as_dict()
    except Exception as e:  # noqa: BLE001 - no nvidia-smi, unknown topology: say so instead of guessing
        return {"kind": "unknown", "GBps": None, "how": f"{type(e).__name__}: {e}"}


def _copy_seconds(copy, device: torch.device) -> float:
    """Seconds of one copy on this rank (median of 3 after 1 warm-up), all ranks starting together."""
    dist.barrier()
    return median_seconds(copy, iters=3, warmup=1, device=device)


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    me = init_rank(a.backend)
    dev, n = me.device, me.world

    # 1. the sweep
    sizes = bench.size_sweep(a.min_bytes, a.max_bytes, a.factor)
    rows = [r for op in a.op for r in bench.sweep(op, sizes, warmup=a.warmup, iters=a.iters, device=dev)]

    # 2. at the largest size: the helper, your loop and the copy limit, interleaved round by round
    big = sizes[-1]
    used = big // 4 * 4
    copy = copy_step(a.copy_bytes, device=dev)
    arms = {
        "helper": lambda: bench.bus_bandwidth("all_reduce", used, bench.time_collective(
            "all_reduce", big, warmup=a.warmup, iters=a.iters, device=dev, check=False)[0], n),
        "yours": lambda: your_busbw(big, dev, iters=a.iters, warmup=a.warmup),
        # every rank copies at once, as every rank moves data in the collective; 2n bytes counted per copy
        "copy": lambda: bench.mean_across_ranks(_copy_seconds(copy, dev), device=dev),
    }
    got: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(a.rounds):
        names = list(arms)[i % 3:] + list(arms)[:i % 3]  # rotate the order from round to round
        for who in names:
            got[who].append(arms[who]())
    helper_bw, yours_bw, copy_s = got["helper"], got["yours"], got["copy"]
    busbw_big, yours_big = statistics.median(helper_bw), statistics.median(yours_bw)
    copy_gbps = 2 * a.copy_bytes / statistics.median(copy_s) / bench.GB
    ceiling = copy_gbps / 2  # the payload rate: n bytes moved = one copy of n bytes, counted as 2n
    fraction = busbw_big / ceiling  # both medians of the same interleaved rounds
    link = link_ceiling(n, dev)
    seconds = [used * bench.bus_factor("all_reduce", n) / (bw * bench.GB) for bw in helper_bw]

    result = {
        "backend": str(dist.get_backend()), "world_size": n, "device": dev.type,
        "rows": [r.as_dict() for r in rows],
        "copy_GBps": copy_gbps, "copy_bytes": a.copy_bytes, "copy_s": copy_s, "payload_ceiling_GBps": ceiling,
        "link": link, "busbw_big": busbw_big, "ceiling_fraction": fraction,
        "control": {"nbytes": big, "iters": a.iters, "rounds": a.rounds, "helper_busbw": helper_bw,
                    "yours_busbw": yours_bw, "yours_big": yours_big, "helper_seconds": seconds,
                    "ratio": yours_big / busbw_big,
                    # each round's two arms ran back to back: the ratio within a round cancels slow drift
                    "ratio_paired": statistics.median(y / h for y, h in zip(yours_bw, helper_bw, strict=True))},
    }
    if me.rank == 0:
        print(f"{result['backend']} on {n} ranks ({dev.type}), {a.warmup} warm-up + {a.iters} timed iterations per size")
        print(bench.format_table(rows))
        print(f"at {big // 2**20} MiB, {a.rounds} rounds of the helper, your loop and the copy, interleaved:")
        print(f"copy bandwidth, {a.copy_bytes // 2**20} MiB on every rank at once, read + write counted: "
              f"{copy_gbps:.2f} GB/s; payload ceiling = copy / 2 = {ceiling:.2f} GB/s")
        print(f"all_reduce busbw {busbw_big:.3f} GB/s = {fraction:.1%} of the payload ceiling")
        if link and link["GBps"]:
            print(f"  = {busbw_big / link['GBps']:.1%} of the {link['kind']} peak, {link['how']}")
        print(f"your loop: busbw {yours_big:.3f} GB/s = {yours_big / busbw_big:.2f} x the helper's (medians)")
    report(result)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
