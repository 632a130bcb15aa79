"""Failure semantics of one-sided transfers, across two processes (chapter 3).

    torchrun --nproc-per-node 2 failures.py --case timeout          # what a timeout bounds, and what not
    torchrun --nproc-per-node 2 failures.py --case dead-peer        # the peer exits mid-conversation
    torchrun --nproc-per-node 2 failures.py --case early-unregister # the owner unregisters too soon

Rank 0 initiates every transfer; rank 1 owns the target memory. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.transport import describe, fetch, pair, publish, quiet_nixl, wait_key

TIMEOUT = 20.0
N = 64 * 2**20                                      # big enough that a transfer takes a while


def timeout_case(t: Any, rank: int, store: dist.Store) -> dict[str, Any]:
    """What a timeout bounds: an async write returns at once; a sync write with a tiny timeout still completes."""
    if rank == 1:
        dst = torch.zeros(N, dtype=torch.uint8)
        mem = t.register_memory(dst)
        publish(store, "f/dst", mem)
        wait_key(store, "f/done", timeout=TIMEOUT)
        print(f"rank 1 sees every byte written: {bool((dst == 7).all())}")
        out = {"all_written": bool((dst == 7).all())}
        t.unregister_memory(mem)
    else:
        src = torch.full((N,), 7, dtype=torch.uint8)
        mem = t.register_memory(src)
        remote = fetch(store, "f/dst", timeout=TIMEOUT)
        t0 = time.monotonic()
        work = t.write(mem.to_view(), remote, async_op=True)
        submit_s = time.monotonic() - t0
        print(f"write(64 MiB, async_op=True) returned a Work; is_completed() right away: {work.is_completed()}")
        work.wait()                                 # always wait before reusing or overlapping the buffers
        t0 = time.monotonic()
        rc = t.write(mem.to_view(), remote, timeout=0.001)
        sync_s = time.monotonic() - t0
        print(f"write(64 MiB, timeout=0.001) -> {rc}; it took longer than its timeout: {sync_s > 0.001}")
        out = {"submit_s": submit_s, "sync_s": sync_s}
        t.unregister_memory(mem)
        store.set("f/done", b"1")
    dist.barrier()
    t.close(timeout=TIMEOUT)
    return out


def dead_peer_case(t: Any, rank: int, store: dist.Store, op_timeout: float) -> None:
    """Rank 1 exits abruptly; rank 0 writes, unregisters and closes after it is gone. Neither rank returns."""
    if rank == 1:
        dst = torch.zeros(N, dtype=torch.uint8)
        publish(store, "f/dst", t.register_memory(dst))
        store.set("f/pid", str(os.getpid()))
        wait_key(store, "f/first-write-done", timeout=TIMEOUT)
        print("rank 1: exiting abruptly (no unregister, no close, no destroy)")
        os._exit(0)                                  # a crash, minus the exit code the launcher would act on
    out: dict[str, Any] = {}
    src = torch.full((N,), 7, dtype=torch.uint8)
    mem = t.register_memory(src)
    remote = fetch(store, "f/dst", timeout=TIMEOUT)
    print(f"write while the peer is alive -> {t.write(mem.to_view(), remote)}")
    peer = int(wait_key(store, "f/pid", timeout=TIMEOUT))
    store.set("f/first-write-done", b"1")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:              # same machine: watch the peer's process disappear
        try:
            os.kill(peer, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            break
    print("the peer process is gone")
    t0 = time.monotonic()
    try:
        t.write(mem.to_view(), remote, timeout=op_timeout)
        print("write after the peer died: returned 0 (!)")
    except Exception as e:
        print(f"write(timeout={op_timeout:g}) after the peer died: {describe(e)}")
    out["write_s"] = time.monotonic() - t0
    try:
        t.unregister_memory(mem)
        print("unregister_memory: allowed")
    except RuntimeError as e:
        print(f"unregister_memory: {describe(e)}")
    t0 = time.monotonic()
    try:
        t.close(timeout=op_timeout)
        print("close: succeeded")
    except Exception as e:
        print(f"close(timeout={op_timeout:g}): {describe(e)}")
    out["close_s"] = time.monotonic() - t0
    print(f"still connected() = {t.connected()}  (closing rejects new work, but resources are held)")
    report(out)
    dist.destroy_process_group()
    # The transport cannot release memory a transfer may still touch; leave without running its finalizers.
    os._exit(0)


def early_unregister_case(t: Any, rank: int, store: dist.Store, op_timeout: float) -> dict[str, Any]:
    """The owner unregisters memory whose descriptor the peer holds; the peer then writes with it."""
    out: dict[str, Any] = {}
    if rank == 1:
        dst = torch.zeros(N, dtype=torch.uint8)
        mem = t.register_memory(dst)
        publish(store, "f/dst", mem)
        t.unregister_memory(mem)                    # WRONG: the peer holds a descriptor and was not told
        store.set("f/unregistered", b"1")
        wait_key(store, "f/done", timeout=TIMEOUT)
        print(f"rank 1: bytes that arrived after unregistering: {int((dst == 7).sum())}")
        out = {"arrived": int((dst == 7).sum())}
    else:
        src = torch.full((N,), 7, dtype=torch.uint8)
        mem = t.register_memory(src)
        remote = fetch(store, "f/dst", timeout=TIMEOUT)
        wait_key(store, "f/unregistered", timeout=TIMEOUT)
        try:
            rc = t.write(mem.to_view(), remote, timeout=op_timeout)
            print(f"write with a stale descriptor -> {rc}")
        except Exception as e:
            print(f"write with a stale descriptor: {describe(e)}")
        store.set("f/done", b"1")
    dist.barrier()
    t.close(timeout=TIMEOUT)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["timeout", "dead-peer", "early-unregister"], required=True)
    p.add_argument("--op-timeout", type=float, default=3.0, help="timeout of the transfers that must fail")
    a = p.parse_args(argv)
    if not a.op_timeout > 0:
        p.error(f"--op-timeout must be > 0 seconds, got {a.op_timeout}")
    quiet_nixl()
    rank = init_rank("gloo").rank
    store = dist.distributed_c10d._get_default_store()
    t = pair(1 - rank, rank=rank, timeout=TIMEOUT, agent_name=f"{a.case}-rank{rank}")
    if a.case == "timeout":
        out = timeout_case(t, rank, store)
    elif a.case == "dead-peer":
        dead_peer_case(t, rank, store, a.op_timeout)  # does not return
        return 1
    else:
        out = early_unregister_case(t, rank, store, a.op_timeout)
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
