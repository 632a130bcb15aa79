"""busbw against the machine's own limit, in one run (chapter 1, notebook 1.3).

    torchrun --nproc-per-node 2 bandwidth.py                                  # gloo on CPU
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl -e 1G --copy-bytes 1G
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl-legacy -e 1G --copy-bytes 1G

1. pt215.bench.sweep: the nccl-tests method (check, warm-up, timed back-to-back iterations, mean over ranks)
2. pt215.roofline.copy_bandwidth on every rank at once: the copy limit of the memory the collective moves.
   It counts a copy of n bytes as 2n (read + write); moving n payload bytes is one such copy, so the ceiling
   busbw is compared with is copy / 2, the payload rate
3. the helper's overhead: the helper against a hand-written loop of the same all_reduce at the largest size,
   alternating the two `--rounds` times; the overhead is the median over rounds of helper / hand - 1
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215 import bench, links
from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_bandwidth
from pt215.timing import Stopwatch, sync


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
                   help="size of the copy-bandwidth measurement (above the last-level cache)")
    p.add_argument("--rounds", type=int, default=10, help="alternations of helper vs hand-timed loop")
    return p


def hand_loop(x: torch.Tensor, iters: int, warmup: int, device: torch.device) -> float:
    """Seconds per all_reduce of `x`, timed by a loop written out by hand (mean over ranks)."""
    for _ in range(warmup):
        dist.all_reduce(x)
    sync(device)
    dist.barrier()
    with Stopwatch(device) as clock:
        for _ in range(iters):
            dist.all_reduce(x)
    return bench.mean_across_ranks(clock.seconds / iters, device=device)


def link_ceiling(n: int, device: torch.device) -> dict | None:
    """busbw's ceiling on GPUs: the link between them (NVLink or PCIe, per direction), not the HBM copy."""
    if device.type != "cuda":
        return None
    try:
        return links.link_peak(n, torch.cuda.get_device_capability(device)).as_dict()
    except Exception as e:  # noqa: BLE001 - no nvidia-smi, unknown topology: say so instead of guessing
        return {"kind": "unknown", "GBps": None, "how": f"{type(e).__name__}: {e}"}


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    me = init_rank(a.backend)
    dev, n = me.device, me.world

    # 1. the sweep
    sizes = bench.size_sweep(a.min_bytes, a.max_bytes, a.factor)
    rows = [r for op in a.op for r in bench.sweep(op, sizes, warmup=a.warmup, iters=a.iters, device=dev)]

    # 2. the limit, same run, all ranks copying at once (as they all move data in the collective)
    copy = bench.mean_across_ranks(copy_bandwidth(a.copy_bytes, device=dev), device=dev) / bench.GB
    ceiling = copy / 2  # the payload rate: n bytes moved = one copy of n bytes, counted as 2n
    link = link_ceiling(n, dev)

    # 3. overhead of the helper against a hand-timed loop of the same all_reduce
    big = sizes[-1]
    x = torch.zeros(big // 4, device=dev)
    helper_s: list[float] = []
    hand_s: list[float] = []
    for i in range(a.rounds):
        order = ("helper", "hand") if i % 2 == 0 else ("hand", "helper")
        for who in order:
            if who == "helper":
                helper_s.append(bench.time_collective("all_reduce", big, warmup=a.warmup, iters=a.iters,
                                                      device=dev, check=False)[0])
            else:
                hand_s.append(hand_loop(x, a.iters, a.warmup, dev))
    helper_med, hand_med = statistics.median(helper_s), statistics.median(hand_s)

    result = {
        "backend": str(dist.get_backend()), "world_size": n, "device": dev.type,
        "rows": [r.as_dict() for r in rows],
        "copy_GBps": copy, "copy_bytes": a.copy_bytes, "payload_ceiling_GBps": ceiling, "link": link,
        "overhead": {"nbytes": big, "iters": a.iters, "rounds": a.rounds, "helper_s": helper_s, "hand_s": hand_s,
                     "helper_median_s": helper_med, "hand_median_s": hand_med,
                     "relative": helper_med / hand_med - 1,
                     "relative_min": min(helper_s) / min(hand_s) - 1,
                     # each round's helper and hand loop ran back to back: the ratio within a round cancels drift
                     "relative_paired": statistics.median(h / k for h, k in zip(helper_s, hand_s, strict=True)) - 1},
    }
    if me.rank == 0:
        print(f"{result['backend']} on {n} ranks ({dev.type}), {a.warmup} warm-up + {a.iters} timed iterations per size")
        print(bench.format_table(rows))
        print(f"copy bandwidth, {a.copy_bytes // 2**20} MiB on every rank at once, read + write counted: "
              f"{copy:.2f} GB/s; payload ceiling = copy / 2 = {ceiling:.2f} GB/s")
        last = [r for r in rows if r.op == "all_reduce"]
        if last:
            print(f"all_reduce busbw at {last[-1].nbytes // 2**20} MiB: {last[-1].busbw:.3f} GB/s "
                  f"= {last[-1].busbw / ceiling:.1%} of the payload ceiling")
            if link and link["GBps"]:
                print(f"  = {last[-1].busbw / link['GBps']:.1%} of the {link['kind']} peak, {link['how']}")
        print(f"helper {helper_med * 1e3:.2f} ms vs hand-timed loop {hand_med * 1e3:.2f} ms per all_reduce: "
              f"overhead {result['overhead']['relative_paired']:+.1%} (median of per-round ratios)")
    report(result)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
