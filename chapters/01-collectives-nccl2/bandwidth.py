"""busbw against the machine's own limit, in one run (chapter 1, notebook 03).

    torchrun --nproc-per-node 2 bandwidth.py                                  # gloo on CPU
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl -e 1G --memcpy-bytes 1G
    torchrun --nproc-per-node 8 bandwidth.py --backend nccl-legacy -e 1G --memcpy-bytes 1G

1. pt215.bench.sweep: the nccl-tests method (check, warm-up, timed back-to-back iterations, mean over ranks)
2. pt215.bench.memcpy_bandwidth on every rank at once: the copy limit of the memory the collective moves
3. the helper's overhead: the helper against a hand-written timing loop of the same all_reduce at the largest
   size, alternating the two `--rounds` times; the overhead is the median over rounds of helper / hand - 1
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from pt215 import bench, links
from pt215.launch import report, shutdown

p = argparse.ArgumentParser()
p.add_argument("--backend", default="gloo")
p.add_argument("--op", nargs="+", default=["all_reduce"], choices=bench.OPS)
p.add_argument("-b", "--min-bytes", type=bench.parse_size, default="4K")
p.add_argument("-e", "--max-bytes", type=bench.parse_size, default="16M")
p.add_argument("-f", "--factor", type=int, default=4)
p.add_argument("-w", "--warmup", type=int, default=3)
p.add_argument("-n", "--iters", type=int, default=10)
p.add_argument("--memcpy-bytes", type=bench.parse_size, default="128M")
p.add_argument("--rounds", type=int, default=10, help="alternations of helper vs hand-timed loop")
a = p.parse_args()

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
cuda = a.backend.startswith("nccl")
dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
dist.init_process_group(a.backend, device_id=dev if cuda else None)
rank, n = dist.get_rank(), dist.get_world_size()

# 1. the sweep
sizes = bench.size_sweep(a.min_bytes, a.max_bytes, a.factor)
rows = [r for op in a.op for r in bench.sweep(op, sizes, warmup=a.warmup, iters=a.iters, device=dev)]

# 2. the limit, same run, all ranks copying at once (as they all move data in the collective)
mem = torch.tensor([bench.memcpy_bandwidth(a.memcpy_bytes, device=dev)], dtype=torch.float64, device=dev)
dist.all_reduce(mem)
memcpy = mem.item() / n
# busbw's ceiling on GPUs is the link between them (NVLink or PCIe, per direction), not the HBM copy above
link = None
if cuda:
    try:
        link = links.link_peak(n, torch.cuda.get_device_capability(dev)).as_dict()
    except Exception as e:  # noqa: BLE001 - no nvidia-smi, unknown topology: say so instead of guessing
        link = {"kind": "unknown", "GBps": None, "how": f"{type(e).__name__}: {e}"}


# 3. overhead of the helper against a hand-timed loop of the same all_reduce
def hand_loop(x: torch.Tensor, iters: int) -> float:
    for _ in range(a.warmup):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return t.item() / n


big = sizes[-1]
x = torch.zeros(big // 4, device=dev)
helper_s, hand_s = [], []
for i in range(a.rounds):
    order = ("helper", "hand") if i % 2 == 0 else ("hand", "helper")
    for who in order:
        if who == "helper":
            helper_s.append(bench.time_collective("all_reduce", big, warmup=a.warmup, iters=a.iters,
                                                  device=dev, check=False)[0])
        else:
            hand_s.append(hand_loop(x, a.iters))
helper_med, hand_med = statistics.median(helper_s), statistics.median(hand_s)

result = {
    "backend": str(dist.get_backend()), "world_size": n, "device": dev.type,
    "rows": [r.as_dict() for r in rows],
    "memcpy_GBps": memcpy, "memcpy_bytes": a.memcpy_bytes, "link": link,
    "overhead": {"nbytes": big, "iters": a.iters, "rounds": a.rounds, "helper_s": helper_s, "hand_s": hand_s,
                 "helper_median_s": helper_med, "hand_median_s": hand_med,
                 "relative": helper_med / hand_med - 1,
                 "relative_min": min(helper_s) / min(hand_s) - 1,
                 # each round's helper and hand loop ran back to back: the ratio within a round cancels slow drift
                 "relative_paired": statistics.median(h / k for h, k in zip(helper_s, hand_s, strict=True)) - 1},
}
if rank == 0:
    print(f"{result['backend']} on {n} ranks ({dev.type}), {a.warmup} warm-up + {a.iters} timed iterations per size")
    print(bench.format_table(rows))
    print(f"memcpy bandwidth, {a.memcpy_bytes // 2**20} MiB on every rank at once: {memcpy:.2f} GB/s")
    last = [r for r in rows if r.op == "all_reduce"]
    if last:
        print(f"all_reduce busbw at {last[-1].nbytes // 2**20} MiB: {last[-1].busbw:.3f} GB/s "
              f"= {last[-1].busbw / memcpy:.1%} of memcpy")
        if link and link["GBps"]:
            print(f"  = {last[-1].busbw / link['GBps']:.1%} of the {link['kind']} peak, {link['how']}")
    print(f"helper {helper_med * 1e3:.2f} ms vs hand-timed loop {hand_med * 1e3:.2f} ms per all_reduce: "
          f"overhead {result['overhead']['relative_paired']:+.1%} (median of per-round ratios)")
report(result)
shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
