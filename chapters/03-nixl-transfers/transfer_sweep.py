"""One-sided NIXL vs two-sided gloo send/recv vs the copy limit, interleaved over a size sweep (chapter 3).

    torchrun --nproc-per-node 2 transfer_sweep.py [--min-kib 4 --max-mib 16 --step 4]
    UCX_PROTO_INFO=y torchrun --nproc-per-node 2 transfer_sweep.py   # UCX also prints the protocols it chose

Every sample is "time until the initiator knows the bytes are in the other buffer". For each size the four arms
are timed round-robin, one sample of each per round (`pt215.timing.interleaved_samples`, 2 warm-up rounds, then
7 to 20 timed rounds), so a busy moment of the machine falls on all four alike and their ratios are comparable.
Below 64 KiB a sample is several back-to-back calls (64 KiB moved per sample), the time divided by the calls:
one call of a few microseconds is too short to time alone on a busy machine.
- NIXL write/read: a synchronous `write`/`read` from rank 0 into/out of rank 1's registered buffer
  (rank 1 makes no call for it: it is blocked in the `recv` of the next gloo round);
- gloo: rank 0 `send`s, rank 1 `recv`s and answers with a 1-byte `send` (the ack rank 0 needs to know);
- copy: `pt215.roofline.copy_step(n)`, one `dst.copy_(src)` of the same size inside rank 0: the limit on one
  machine, since a transfer between two processes is at least one copy of its bytes.
Every transfer is checked after each size: rank 1 compares the bytes NIXL wrote into its buffer and the bytes
gloo delivered with the expected pattern, rank 0 the bytes NIXL read back.

Around the sweep, the controls the chapter's conclusions rest on:
- gloo alone: before the sweep, gloo send+ack rounds of GLOO_AB_BYTES with no NIXL endpoint alive and with one
  alive on each rank (its progress thread polling), alternated GLOO_AB_REPS times: the sweep's gloo arm runs
  beside NIXL's polling threads, and this says what they cost it on this machine;
- CPU time: rank 0's thread CPU time (`pt215.timing.thread_cpu_samples`) per copy, write and read of the
  largest size: one copy's worth of work on the initiator's thread, or more;
- sockets: the bytes rank 0's TCP sockets carried during those writes and reads (`pt215.transport.tcp_socket_bytes`,
  the kernel's own count): about none if UCX moved them by cross-memory attach, about the payload if by TCP;
- threads: every thread's time on a CPU and waiting for one over the sweep, on both ranks
  (`pt215.transport.thread_times`), the threads the NIXL endpoint started marked as such;
- registration: rank 0's `register_memory` + `to_remote_buffer` + `unregister_memory` per size.

The samples are seconds. A rate computed from them is a payload rate, n bytes per sample: for the copy arm that
is `pt215.roofline.copy_bandwidth(n) / 2`, because `copy_bandwidth` counts a copy's read and write (2n bytes)
while a transfer delivers n.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_step
from pt215.timing import Stopwatch, interleaved_samples, thread_cpu_samples, time_samples
from pt215.transport import fetch, pair, publish, quiet_nixl, tcp_socket_bytes, thread_activity, thread_times, wait_key

TIMEOUT = 30.0
WARMUP = 2  # untimed rounds per size (rank 1 answers them too)
SAMPLE_BYTES = 64 * 2**10  # below this size, a sample is several calls: SAMPLE_BYTES moved per sample
ARMS = ("nixl_write", "nixl_read", "gloo", "copy")
CPU_SAMPLES = 5  # thread-CPU samples per arm at the largest size
GLOO_AB_BYTES = 64 * 2**10  # the gloo-alone control: message size,
GLOO_AB_REPS = 3  # alternations of (no NIXL endpoint, one endpoint per rank),
GLOO_AB_ROUNDS = 20  # and timed send+ack rounds per arm and alternation


def calls_for(nbytes: int) -> int:
    """Back-to-back calls per sample: enough for SAMPLE_BYTES moved, at least 1."""
    return max(1, SAMPLE_BYTES // nbytes)


def iters_for(nbytes: int, budget_mib: int) -> int:
    """Timed rounds for one size: `budget_mib` MiB moved per arm, between 7 and 20 rounds."""
    return max(7, min(20, budget_mib * 2**20 // (nbytes * calls_for(nbytes))))


def pattern(nbytes: int, salt: int) -> torch.Tensor:
    return ((torch.arange(nbytes, dtype=torch.int32) + salt) % 251).to(torch.uint8)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-kib", type=int, default=4)
    p.add_argument("--max-mib", type=int, default=16)
    p.add_argument("--step", type=int, default=4)
    p.add_argument("--budget-mib", type=int, default=128, help="bytes moved per size and arm (sets the rounds)")
    return p


def gloo_round(rank: int, x: torch.Tensor, ack: torch.Tensor) -> None:
    """One send + 1-byte ack from rank 0's side; the matching recv + ack on rank 1's."""
    if rank == 0:
        dist.send(x, dst=1)
        dist.recv(ack, src=1)
    else:
        dist.recv(x, src=0)
        dist.send(ack, dst=0)


def gloo_alone_vs_beside_nixl(rank: int) -> dict[str, Any]:
    """gloo send+ack rounds with no NIXL endpoint in either process, then with one per process (each with its
    polling progress thread), alternated: what NIXL's threads cost a two-sided transfer on this machine."""
    x, ack = pattern(GLOO_AB_BYTES, 7), torch.zeros(1, dtype=torch.uint8)
    out: dict[str, Any] = {"bytes": GLOO_AB_BYTES, "alone": [], "beside_nixl": [], "threads_left": 0}
    for _ in range(GLOO_AB_REPS):
        for arm in ("alone", "beside_nixl"):
            before = set(thread_times())
            t = pair(1 - rank, rank=rank, timeout=TIMEOUT) if arm == "beside_nixl" else None
            dist.barrier()
            samples = time_samples(lambda: gloo_round(rank, x, ack), iters=GLOO_AB_ROUNDS, warmup=1)
            dist.barrier()
            out[arm] += samples              # rank 0's are "time until it knows the bytes arrived"
            if t is not None:
                t.close(timeout=TIMEOUT)
                del t
                gc.collect()                 # the agent, and with it its progress thread, goes now
                out["threads_left"] = max(out["threads_left"], len(set(thread_times()) - before))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.min_kib < 1 or a.step < 2 or a.budget_mib < 1 or a.max_mib * 1024 < a.min_kib:
        p.error(f"need --min-kib >= 1, --step >= 2, --budget-mib >= 1 and --max-mib >= --min-kib / 1024, got "
                f"{a.min_kib}, {a.step}, {a.budget_mib} and {a.max_mib}")
    quiet_nixl()
    rank = init_rank("gloo").rank
    store = dist.distributed_c10d._get_default_store()
    sizes, n = [], a.min_kib * 1024
    while n <= a.max_mib * 2**20:
        sizes.append(n)
        n *= a.step
    big = sizes[-1]
    ack = torch.zeros(1, dtype=torch.uint8)

    gloo_ab = gloo_alone_vs_beside_nixl(rank)
    before_pair = set(thread_times())
    t = pair(1 - rank, rank=rank, timeout=TIMEOUT, agent_name=f"sweep-rank{rank}")
    nixl_threads = sorted(set(thread_times()) - before_pair)
    buf = torch.zeros(big, dtype=torch.uint8)           # rank 0: the source of writes; rank 1: the peer's buffer
    mem = t.register_memory(buf)
    if rank == 1:
        publish(store, "sweep/buf", mem)
    else:
        remote = fetch(store, "sweep/buf", timeout=TIMEOUT)
    back = torch.zeros(big, dtype=torch.uint8)          # rank 0 reads into this
    back_mem = t.register_memory(back)
    rows, ok = [], []
    dist.barrier()
    threads_before, clock = thread_times(), Stopwatch()
    for i, n in enumerate(sizes):
        iters, calls = iters_for(n, a.budget_mib), calls_for(n)
        sent = pattern(n, i + 13)
        if rank == 0:
            buf[:n].copy_(pattern(n, i))
            back[:n].zero_()
        else:
            buf[:n].zero_()                             # so that the check below sees what NIXL wrote
        dist.barrier()
        if rank == 0:
            view, rview = mem.to_view(0, n), back_mem.to_mutable_view(0, n)
            arms = {"nixl_write": lambda view=view: t.write(view, remote),
                    "nixl_read": lambda rview=rview: t.read(rview, remote),  # reads back what the write put there
                    "gloo": lambda sent=sent: gloo_round(0, sent, ack),
                    "copy": copy_step(n)}  # copy_bandwidth's unit of work, counted as 2n
            samples = interleaved_samples(arms, iters=iters, warmup=WARMUP, calls=calls)  # seconds per call
            rows.append({"bytes": n, "iters": iters, "calls": calls, **samples})
            ok.append(torch.equal(back[:n], pattern(n, i)))
        else:
            dst = torch.zeros(n, dtype=torch.uint8)
            for _ in range(WARMUP + iters * calls):     # one gloo round trip per call on rank 0
                gloo_round(1, dst, ack)
            ok.append(torch.equal(dst, sent))
        dist.barrier()
        if rank == 1:
            ok.append(torch.equal(buf[:n], pattern(n, i)))
    seconds = clock.seconds
    activity = thread_activity(threads_before, thread_times(), seconds)
    threads = {str(tid): {**asdict(act), "runnable": act.runnable,
                          "role": "main" if tid == os.getpid() else "nixl" if tid in nixl_threads else "other"}
               for tid, act in activity.items()}

    extra: dict[str, Any] = {}
    if rank == 0:
        view, rview = mem.to_view(), back_mem.to_mutable_view()
        cpu_arms = {"copy": copy_step(big), "nixl_write": lambda: t.write(view, remote),
                    "nixl_read": lambda: t.read(rview, remote)}
        extra["cpu"] = {"bytes": big, **{k: [] for k in cpu_arms}}
        # what rank 0's TCP sockets carried during each arm (None where Linux cannot say)
        sockets = {k: 0 for k in cpu_arms} if tcp_socket_bytes() is not None else None
        for _ in range(CPU_SAMPLES):                    # round-robin too: one sample of each arm per round
            for k, f in cpu_arms.items():
                carried = tcp_socket_bytes()
                extra["cpu"][k] += thread_cpu_samples(f, iters=1)
                if sockets is not None:
                    sockets[k] += tcp_socket_bytes() - carried
        extra["socket_bytes"] = sockets
        extra["register"] = []
        for n in sizes:
            x = torch.ones(n, dtype=torch.uint8)

            def register(x: torch.Tensor = x) -> None:
                m = t.register_memory(x)
                m.to_remote_buffer()
                t.unregister_memory(m)

            extra["register"].append({"bytes": n, "seconds": time_samples(register, iters=9, warmup=1)})
        store.set("sweep/controls-done", b"1")
    else:
        wait_key(store, "sweep/controls-done", timeout=TIMEOUT * 4)  # idle while rank 0 measures

    print(f"{len(sizes)} sizes from {sizes[0] // 1024} KiB to {big // 2**20} MiB, {len(ARMS)} arms interleaved "
          f"per round; every transfer verified: {all(ok)}")
    dist.barrier()
    t.unregister_memory(back_mem)
    t.unregister_memory(mem)
    t.close(timeout=TIMEOUT)
    report({"rows": rows, "verified": all(ok), "arms": list(ARMS), "warmup": WARMUP,
            "threads": threads, "sweep_s": seconds, "gloo_ab": gloo_ab, **extra})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
