"""Collective bandwidth measured the nccl-tests way (chapter 1, "Collectives on the rewritten NCCL backend").

Formulas (GB/s with GB = 10**9 bytes; S in bytes, t in seconds, n ranks):

    algbw = S / t
    busbw = algbw * factor(op, n)

    all_reduce                                2(n-1)/n   S = the tensor each rank reduces
    all_gather, reduce_scatter                 (n-1)/n   S = the whole (gathered / unscattered) array
    all_to_all                                 (n-1)/n   S = each rank's whole send buffer
    broadcast, reduce, send_recv                     1   S = the tensor

Measurement (inside an initialized process group): for each size, a correctness check, `warmup`
untimed iterations, then `iters` iterations issued back to back and timed together with one
`pt215.timing.Stopwatch` (the device synchronized once at the end, as nccl-tests does); the time per
iteration is averaged across ranks with an all_reduce. In the same run, the command line measures the copy
bandwidth of the memory the collective moves with `pt215.roofline.copy_bandwidth` (CPU: a large `copy_`;
GPU: device-to-device). That figure counts a copy of n bytes as 2n (read + write); the payload ceiling a
collective's busbw is compared with is half of it, the rate at which n bytes can be moved at all.

Command line (works on a laptop; runs under torchrun): `python -m pt215.bench --help`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from pt215 import links
from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_bandwidth
from pt215.timing import Stopwatch, sync

__all__ = [
    "OPS",
    "SweepRow",
    "algbw",
    "bus_bandwidth",
    "bus_factor",
    "format_table",
    "main",
    "mean_across_ranks",
    "parse_size",
    "size_sweep",
    "sweep",
    "time_collective",
]

GB = 1e9
COPY_MIN_DEFAULT = 128 * 2**20  # the CLI's smallest default copy size (some CPUs' last-level caches are larger)

#: Collectives the benchmark knows, with the nccl-tests bus-bandwidth factor as a function of n.
_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
OPS: tuple[str, ...] = tuple(_FACTORS)


# ---------------------------------------------------------------- argument checks


def _check_op(op: object) -> str:
    if not isinstance(op, str) or op not in _FACTORS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    return op


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


def _check_seconds(seconds: object) -> float:
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not ok or not math.isfinite(seconds) or seconds <= 0:  # type: ignore[arg-type]
        raise ValueError(f"seconds must be a finite number > 0; got {seconds!r}")
    return float(seconds)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the formulas


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests factor that turns algbw into busbw for `op` on `world_size` ranks."""
    return _FACTORS[_check_op(op)](_check_int("world_size", world_size, 1))


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth S / t in GB/s (10**9 bytes per second)."""
    return _check_int("nbytes", nbytes, 0) / _check_seconds(seconds) / GB


def bus_bandwidth(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw(nbytes, seconds) * bus_factor(op, world_size), as nccl-tests reports it.

    `nbytes` is S: the whole array for all_gather / reduce_scatter, each rank's send buffer for all_to_all,
    the tensor otherwise.
    """
    factor = bus_factor(op, world_size)
    return algbw(nbytes, seconds) * factor


# ---------------------------------------------------------------- sizes

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str | int) -> int:
    """`"64K"` -> 65536, `"1M"` -> 1048576 (binary units, as nccl-tests' -b/-e); ints pass through."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _check_int("size", text, 1)
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"size must look like 4096, 64K, 1M or 1G; got {text!r}")
    return _check_int("size", int(m.group(1)) * _UNITS[m.group(2).upper()], 1)


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Sizes min_bytes, min_bytes*factor, ... up to max_bytes (nccl-tests -b/-e/-f)."""
    _check_int("min_bytes", min_bytes, 1)
    _check_int("max_bytes", max_bytes, 1)
    _check_int("factor", factor, 2)
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes must be >= min_bytes; got max_bytes={max_bytes}, min_bytes={min_bytes}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


# ---------------------------------------------------------------- running one collective


def _buffers(op: str, nbytes: int, n: int, dtype: torch.dtype, device: torch.device):
    """Input/output tensors whose S (as bus_bandwidth defines it) is <= nbytes; returns (inp, out, S)."""
    esize = torch.empty((), dtype=dtype).element_size()
    split = n if op in ("all_gather", "reduce_scatter", "all_to_all") else 1  # the array splits over ranks
    count = nbytes // esize
    count -= count % split
    if count < 1:
        raise ValueError(f"nbytes={nbytes} is too small for {op} on {n} ranks with {dtype} "
                         f"(needs at least {esize * split})")
    whole = torch.zeros(count, dtype=dtype, device=device)
    if op == "all_gather":
        return torch.zeros(count // n, dtype=dtype, device=device), whole, count * esize
    if op == "reduce_scatter":
        return whole, torch.zeros(count // n, dtype=dtype, device=device), count * esize
    if op in ("all_to_all", "send_recv"):
        return whole, torch.zeros_like(whole), count * esize
    return whole, None, count * esize


def _issuer(op: str, inp: torch.Tensor, out: torch.Tensor | None, group) -> Callable[[], None]:
    """A zero-argument function that issues one `op` (blocking from the caller's view)."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(inp, group_src=0, group=group)
    if op == "reduce":
        return lambda: dist.reduce(inp, group_dst=0, group=group)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    # send_recv: a ring, as nccl-tests' sendrecv_perf: send to rank+1, receive from rank-1.
    nxt, prv = dist.get_global_rank(group or dist.group.WORLD, (rank + 1) % n), \
        dist.get_global_rank(group or dist.group.WORLD, (rank - 1) % n)

    def send_recv() -> None:
        ops = [dist.P2POp(dist.isend, inp, nxt, group), dist.P2POp(dist.irecv, out, prv, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    return send_recv


def _check_result(op: str, inp: torch.Tensor, out: torch.Tensor | None, group, device) -> bool:
    """One correctness pass: rank r contributes r+1 everywhere; compare with what op must produce."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    inp.fill_(rank + 1)
    if out is not None:
        out.zero_()
    _issuer(op, inp, out, group)()
    sync(device)
    total = n * (n + 1) / 2
    if op == "all_reduce":
        ok = bool((inp == total).all())
    elif op == "broadcast":
        ok = bool((inp == 1).all())
    elif op == "reduce":
        ok = bool((inp == total).all()) if rank == 0 else True
    elif op == "all_gather":
        ok = bool((out == torch.arange(1, n + 1, device=device).repeat_interleave(inp.numel())).all())
    elif op == "reduce_scatter":
        ok = bool((out == total).all())
    elif op == "all_to_all":
        ok = bool((out == torch.arange(1, n + 1, device=device).repeat_interleave(out.numel() // n)).all())
    else:
        ok = bool((out == (rank - 1) % n + 1).all())
    inp.zero_()
    if out is not None:
        out.zero_()
    return ok


def mean_across_ranks(value: float, group=None, device: torch.device | str = "cpu") -> float:
    """`value` averaged over the ranks of `group` (default: WORLD); `device` is where the backend reduces."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def time_collective(op: str, nbytes: int, *, warmup: int = 5, iters: int = 20, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None, group=None, check: bool = True
                    ) -> tuple[float, int, bool]:
    """Seconds per `op` of `nbytes` (mean over `iters` back-to-back calls, then over ranks).

    Returns (seconds, S actually used, correct). Call on every rank of `group` (default: WORLD).
    """
    _check_op(op)
    _check_int("nbytes", nbytes, 1)
    _check_int("warmup", warmup, 0)
    _check_int("iters", iters, 1)
    if not dist.is_initialized():
        raise RuntimeError("time_collective needs an initialized process group (run it under torchrun)")
    device = torch.device(device) if device is not None else _default_device(group)
    n = dist.get_world_size(group)
    inp, out, used = _buffers(op, nbytes, n, dtype, device)
    ok = _check_result(op, inp, out, group, device) if check else True
    issue = _issuer(op, inp, out, group)
    for _ in range(warmup):
        issue()
    sync(device)
    dist.barrier(group=group)
    with Stopwatch(device) as clock:  # all iterations issued back to back, the device synchronized once at the end
        for _ in range(iters):
            issue()
    per_iter = clock.seconds / iters
    return mean_across_ranks(per_iter, group, device), used, ok


@dataclass(frozen=True)
class SweepRow:
    """One line of a sweep: what ran, how long it took, and its bandwidths (GB/s)."""

    op: str
    nbytes: int
    count: int
    dtype: str
    world_size: int
    seconds: float
    algbw: float
    busbw: float
    correct: bool

    def as_dict(self) -> dict:
        """JSON-serialisable view."""
        return asdict(self)


def sweep(op: str, sizes: Sequence[int], *, warmup: int = 5, iters: int = 20, dtype: torch.dtype = torch.float32,
          device: torch.device | str | None = None, group=None, check: bool = True) -> list[SweepRow]:
    """Run `op` at every size in `sizes` (bytes) and return one SweepRow per size, nccl-tests style."""
    _check_op(op)
    if isinstance(sizes, int | str) or not sizes:
        raise ValueError(f"sizes must be a non-empty sequence of byte counts; got {sizes!r}")
    n = dist.get_world_size(group) if dist.is_initialized() else 1
    rows = []
    for s in sizes:
        secs, used, ok = time_collective(op, s, warmup=warmup, iters=iters, dtype=dtype, device=device,
                                         group=group, check=check)
        esize = torch.empty((), dtype=dtype).element_size()
        rows.append(SweepRow(op, used, used // esize, str(dtype).removeprefix("torch."), n, secs,
                             algbw(used, secs), bus_bandwidth(op, used, secs, n), ok))
    return rows


# ---------------------------------------------------------------- output and command line


def _default_device(group=None) -> torch.device:
    backend = dist.get_backend(group) if dist.is_initialized() else "gloo"
    if "nccl" in str(backend) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _human(nbytes: int) -> str:
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{nbytes}B"


def format_table(rows: Sequence[SweepRow]) -> str:
    """nccl-tests-like text table: size, count, time (us), algbw, busbw (GB/s), correct."""
    lines = [f"{'op':<15}{'size':>8}{'count':>12}{'time_us':>12}{'algbw':>10}{'busbw':>10}  ok"]
    for r in rows:
        lines.append(f"{r.op:<15}{_human(r.nbytes):>8}{r.count:>12}{r.seconds * 1e6:>12.1f}"
                     f"{r.algbw:>10.3f}{r.busbw:>10.3f}  {'yes' if r.correct else 'NO'}")
    return "\n".join(lines)


_EPILOG = """\
formulas (GB = 1e9 B): algbw = S/t; busbw = algbw * factor
  all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1

launch:
  one machine:  torchrun --nproc-per-node 4 -m pt215.bench --op all_reduce
  two nodes:    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
                  --rdzv-endpoint HEAD_NODE:29500 --rdzv-id bench1 -m pt215.bench --op all_reduce
  no torchrun:  python -m pt215.bench  (a 1-rank group: busbw of all_reduce is 0 by definition)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pt215.bench", description=__doc__.splitlines()[0],
                                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", nargs="+", default=["all_reduce"], choices=OPS, help="collective(s) to sweep")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("32K"), help="smallest size (32K)")
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("16M"), help="largest size (16M)")
    p.add_argument("-f", "--factor", type=int, default=4, help="size multiplier between steps (4)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations per size (5)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (20)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--backend", default="auto",
                   help="process-group backend: auto (nccl with GPUs, else gloo), gloo, nccl, nccl-legacy, ...")
    p.add_argument("--copy-bytes", type=parse_size, default=None,
                   help="size of the copy-bandwidth measurement (default: the largest sweep size, "
                        "at least 128M; a last-level cache larger than it can serve part of it)")
    p.add_argument("--no-check", action="store_true", help="skip the per-size correctness check")
    p.add_argument("--net-gbps", type=float, default=None,
                   help="on GPUs across nodes: the network's peak, GB/s per direction per GPU (else unknown)")
    return p


def _link(n: int, device: torch.device, net_gbps: float | None) -> dict | None:
    """busbw's ceiling on GPUs (`pt215.links.link_peak`): NVLink/PCIe on one node, the network across nodes
    (unknown unless `--net-gbps`); None on CPU, where the payload ceiling is the only one."""
    if device.type != "cuda":
        return None
    try:
        return links.link_peak(n, torch.cuda.get_device_capability(device), net_gbps=net_gbps).as_dict()
    except (OSError, ValueError, IndexError) as e:  # no nvidia-smi, UUIDs in CUDA_VISIBLE_DEVICES, ...
        return {"kind": "unknown", "GBps": None, "how": f"{type(e).__name__}: {e}"}


def _join(backend: str) -> tuple[torch.device, bool]:
    """Join the job through `launch.init_rank` (a 1-rank group without torchrun), unless a process group
    exists already (a caller's); return (device, whether this call joined)."""
    if dist.is_initialized():
        return _default_device(), False
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    return init_rank(backend).device, True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m pt215.bench`; a sweep of one collective (chapter 1.3)."""
    p = _parser()
    a = p.parse_args(argv)
    if a.net_gbps is not None and not a.net_gbps > 0:
        p.error(f"--net-gbps must be a positive GB/s per direction, got {a.net_gbps}")
    sizes = size_sweep(a.min_bytes, a.max_bytes, a.factor)
    dtype = getattr(torch, a.dtype)
    device, joined = _join(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    try:
        rows = [r for op in a.op for r in sweep(op, sizes, warmup=a.warmup, iters=a.iters, dtype=dtype,
                                                 device=device, check=not a.no_check)]
        copy_bytes = a.copy_bytes or max(max(sizes), COPY_MIN_DEFAULT)
        copy = mean_across_ranks(copy_bandwidth(copy_bytes, device=device), None, device) / GB
        ceiling = copy / 2  # n payload bytes moved = one copy of n bytes, which copy_bandwidth counts as 2n
        link = _link(n, device, a.net_gbps)
        result = {"backend": str(dist.get_backend()), "world_size": n, "device": device.type,
                  "copy_GBps": copy, "copy_bytes": copy_bytes, "payload_ceiling_GBps": ceiling, "link": link,
                  "rows": [r.as_dict() for r in rows]}
        if rank == 0:
            print(f"backend {result['backend']}, {n} rank(s), {device.type}, {a.dtype}, "
                  f"{a.warmup} warm-up + {a.iters} timed iterations per size")
            print(format_table(rows))
            print(f"copy bandwidth ({device.type}, {_human(copy_bytes)}, same run, read + write counted): "
                  f"{copy:.2f} GB/s; payload ceiling = copy / 2 = {ceiling:.2f} GB/s")
            for op in a.op:
                last = [r for r in rows if r.op == op][-1]
                print(f"{op} busbw at {_human(last.nbytes)}: {last.busbw:.3f} GB/s = "
                      f"{last.busbw / ceiling:.1%} of the payload ceiling")
                if link is not None:
                    print(f"  = {last.busbw / link['GBps']:.1%} of the {link['kind']} peak ({link['how']})"
                          if link["GBps"] else f"  link peak unknown: {link['how']}")
        report(result)
    finally:
        if joined:
            shutdown()
    return 0 if all(r.correct for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
