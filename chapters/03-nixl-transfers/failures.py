"""Failure semantics of one-sided transfers, across two processes (chapter 3).

    torchrun --nproc-per-node 2 failures.py --case timeout          # what a timeout bounds, and what not
    torchrun --nproc-per-node 2 failures.py --case dead-peer        # the peer exits mid-conversation
    torchrun --nproc-per-node 2 failures.py --case early-unregister # the owner unregisters too soon

Rank 0 initiates every transfer; rank 1 owns the target memory. Every wait is bounded.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from pt215.launch import report, shutdown
from pt215.transport import describe, fetch, pair, publish, quiet_nixl, wait_key

quiet_nixl()

p = argparse.ArgumentParser()
p.add_argument("--case", choices=["timeout", "dead-peer", "early-unregister"], required=True)
p.add_argument("--op-timeout", type=float, default=3.0, help="timeout of the transfers that must fail")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
TIMEOUT = 20.0
N = 64 * 2**20                                      # big enough that a transfer takes a while
t = pair(1 - rank, rank=rank, timeout=TIMEOUT, agent_name=f"{a.case}-rank{rank}")
out: dict = {}


if a.case == "timeout":
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

elif a.case == "dead-peer":
    if rank == 1:
        dst = torch.zeros(N, dtype=torch.uint8)
        publish(store, "f/dst", t.register_memory(dst))
        store.set("f/pid", str(os.getpid()))
        wait_key(store, "f/first-write-done", timeout=TIMEOUT)
        print("rank 1: exiting abruptly (no unregister, no close, no destroy)")
        os._exit(0)                                  # a crash, minus the exit code the launcher would act on
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
        t.write(mem.to_view(), remote, timeout=a.op_timeout)
        print("write after the peer died: returned 0 (!)")
    except Exception as e:
        print(f"write(timeout={a.op_timeout:g}) after the peer died: {describe(e)}")
    out["write_s"] = time.monotonic() - t0
    try:
        t.unregister_memory(mem)
        print("unregister_memory: allowed")
    except RuntimeError as e:
        print(f"unregister_memory: {describe(e)}")
    t0 = time.monotonic()
    try:
        t.close(timeout=a.op_timeout)
        print("close: succeeded")
    except Exception as e:
        print(f"close(timeout={a.op_timeout:g}): {describe(e)}")
    out["close_s"] = time.monotonic() - t0
    print(f"still connected() = {t.connected()}  (closing rejects new work, but resources are held)")
    report(out)
    dist.destroy_process_group()
    # The transport cannot release memory a transfer may still touch; leave without running its finalizers.
    os._exit(0)

else:  # early-unregister
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
            rc = t.write(mem.to_view(), remote, timeout=a.op_timeout)
            print(f"write with a stale descriptor -> {rc}")
        except Exception as e:
            print(f"write with a stale descriptor: {describe(e)}")
        store.set("f/done", b"1")
    dist.barrier()
    t.close(timeout=TIMEOUT)

report(out)
shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
