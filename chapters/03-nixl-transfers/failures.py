"""Failure semantics of one-sided transfers, across two processes (chapter 3).

    torchrun --nproc-per-node 2 failures.py                          # every case below, in this order
    torchrun --nproc-per-node 2 failures.py --case timeout           # what a timeout bounds, and what not
    torchrun --nproc-per-node 2 failures.py --case early-unregister  # the owner unregisters too soon
    torchrun --nproc-per-node 2 failures.py --case progress          # whose NIXL progress thread must run
    torchrun --nproc-per-node 2 failures.py --case dead-peer         # the peer exits mid-conversation

Rank 0 initiates every transfer; rank 1 owns the target memory. Every wait is bounded: the transfers that
must fail use `--op-timeout` seconds (the transport's default timeout, so `close()` and `with transport:`
use it too), and the one wait that has no deadline of its own (`wait_all(works)`) is bounded from outside
with `asyncio.wait_for`. In the dead-peer case rank 1 exits abruptly and rank 0 leaves without running
the transport's finalizers, as a process whose transfers can never finish must.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.transport import describe, fetch, pair, publish, quiet_nixl, wait_key

TIMEOUT = 20.0                                      # bootstrap and the waits that must succeed
N = 64 * 2**20                                      # big enough that a transfer takes a while
CASES = ("timeout", "early-unregister", "progress", "dead-peer")


def timed(events: list[dict[str, Any]], call: str, fn: Callable[[], Any]) -> str:
    """Run `fn()`, record how long it took and how it ended, print one line; return the outcome."""
    start = time.monotonic()
    try:
        result = fn()
        outcome = f"returned {result!r}"
    except Exception as e:  # noqa: BLE001 - the outcome is what this shows
        outcome = describe(e)
    end = time.monotonic()
    events.append({"call": call, "start": start, "end": end, "outcome": outcome})
    print(f"{call} -> {outcome}")
    return outcome


def target(t: Any, store: dist.Store, key: str) -> tuple[torch.Tensor, Any]:
    """Rank 1: a zeroed N-byte buffer, registered, its descriptor published under `key`."""
    dst = torch.zeros(N, dtype=torch.uint8)
    mem = t.register_memory(dst)
    publish(store, key, mem)
    return dst, mem


def source(t: Any, store: dist.Store, key: str) -> tuple[Any, Any]:
    """Rank 0: an N-byte buffer of 7s, registered, and the descriptor rank 1 published under `key`."""
    mem = t.register_memory(torch.full((N,), 7, dtype=torch.uint8))
    return mem, fetch(store, key, timeout=TIMEOUT)


def timeout_case(t: Any, rank: int, store: dist.Store) -> dict[str, Any]:
    """What a timeout bounds: an async write is complete on return; a sync write with a tiny timeout succeeds."""
    if rank == 1:
        dst, mem = target(t, store, "timeout/dst")
        wait_key(store, "timeout/done", timeout=TIMEOUT)
        print(f"rank 1 sees every byte written: {bool((dst == 7).all())}")
        out = {"all_written": bool((dst == 7).all())}
    else:
        mem, remote = source(t, store, "timeout/dst")
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
        store.set("timeout/done", b"1")
    dist.barrier()
    t.unregister_memory(mem)
    return out


def early_unregister_case(t: Any, rank: int, store: dist.Store) -> dict[str, Any]:
    """The owner unregisters memory whose descriptor the peer holds; the peer then writes with it."""
    out: dict[str, Any] = {}
    if rank == 1:
        dst, mem = target(t, store, "early/dst")
        t.unregister_memory(mem)                    # WRONG: the peer holds a descriptor and was not told
        store.set("early/unregistered", b"1")
        wait_key(store, "early/done", timeout=TIMEOUT)
        print(f"rank 1: bytes that arrived after unregistering: {int((dst == 7).sum())}")
        out = {"arrived": int((dst == 7).sum())}
    else:
        mem, remote = source(t, store, "early/dst")
        wait_key(store, "early/unregistered", timeout=TIMEOUT)
        try:
            print(f"write with a stale descriptor -> {t.write(mem.to_view(), remote)}")
        except Exception as e:  # noqa: BLE001 - shown, whatever it is
            print(f"write with a stale descriptor: {describe(e)}")
        store.set("early/done", b"1")
        t.unregister_memory(mem)
    dist.barrier()
    return out


def progress_case(rank: int, store: dist.Store, op_timeout: float) -> dict[str, Any]:
    """Two more endpoint pairs: first the initiator without NIXL's progress thread, then the owner without it.

    The second leaves a transfer that never completes; its endpoints are left as they are (the process
    leaves without closing them)."""
    out: dict[str, Any] = {}
    for name, off in (("initiator", 0), ("owner", 1)):
        t = pair(1 - rank, rank=rank, timeout=TIMEOUT, op_timeout=op_timeout, agent_name=f"{name}-off-{rank}",
                 enable_prog_thread=rank != off)
        if rank == 1:
            dst = torch.zeros(2**20, dtype=torch.uint8)
            mem = t.register_memory(dst)
            publish(store, f"progress/{name}", mem)
            wait_key(store, f"progress/{name}/done", timeout=TIMEOUT)
            out[name] = {"landed": bool((dst == 7).all())}
            print(f"{name}'s progress thread off: the bytes landed in rank 1's buffer: {out[name]['landed']}")
        else:
            src = t.register_memory(torch.full((2**20,), 7, dtype=torch.uint8))
            remote = fetch(store, f"progress/{name}", timeout=TIMEOUT)
            events: list[dict[str, Any]] = []
            outcome = timed(events, f"{name}'s progress thread off: write(1 MiB, timeout={op_timeout:g})",
                            lambda t=t, src=src, remote=remote: t.write(src.to_view(), remote))
            out[name] = {"outcome": outcome, "seconds": events[0]["end"] - events[0]["start"]}
            store.set(f"progress/{name}/done", b"1")
        dist.barrier()
        if name == "initiator":                      # the healthy pair closes; the stuck one cannot
            t.close(timeout=TIMEOUT)
    return out


def dead_peer_case(t: Any, rank: int, store: dist.Store, op_timeout: float, results: dict[str, Any]) -> None:
    """Rank 1 exits abruptly; rank 0 then tries every way to wait, unregister and close. Neither rank returns."""
    from torch.distributed._transport import wait_all

    if rank == 1:
        target(t, store, "dead/dst")
        store.set("dead/pid", str(os.getpid()))
        wait_key(store, "dead/first-write-done", timeout=TIMEOUT)
        report(results)
        print("rank 1: exiting abruptly (no unregister, no close, no destroy)")
        os._exit(0)                                  # a crash, minus the exit code the launcher would act on
    mem, remote = source(t, store, "dead/dst")
    print(f"write while the peer is alive -> {t.write(mem.to_view(), remote)}")
    peer = int(wait_key(store, "dead/pid", timeout=TIMEOUT))
    store.set("dead/first-write-done", b"1")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:              # same machine: watch the peer's process disappear
        try:
            os.kill(peer, 0)
            time.sleep(0.02)
        except ProcessLookupError:
            break
    print("the peer process is gone")
    ev: list[dict[str, Any]] = []
    timed(ev, f"write(timeout={op_timeout:g})", lambda: t.write(mem.to_view(), remote, timeout=op_timeout))
    work = t.write(mem.to_view(), remote, async_op=True)
    deadline = time.monotonic() + TIMEOUT           # poll until NIXL has reported on it (each call polls once)
    while work._error is None and not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)
    error = work._error                              # private: where the Work keeps what NIXL reported
    state = {"is_completed": work.is_completed(), "exception": repr(work.exception()),
             "stored_error": type(error).__name__ if error is not None else None}
    print(f"write(async_op=True) -> Work: is_completed() = {state['is_completed']}, exception() = "
          f"{state['exception']}, the error NIXL reported is kept inside it: {state['stored_error']}")
    timed(ev, "work.wait(timedelta(seconds=0.25))", lambda: work.wait(timedelta(seconds=0.25)))
    timed(ev, f"work.wait()  (0 = the operation's timeout, {op_timeout:g} s)", lambda: work.wait())
    timed(ev, "await wait_all([work], timeout=0.25)", lambda: asyncio.run(wait_all([work], timeout=0.25)))
    bound = 1.0
    timed(ev, f"await wait_all([work]) inside asyncio.wait_for(..., {bound:g})",
          lambda: asyncio.run(asyncio.wait_for(wait_all([work]), bound)))
    timed(ev, "unregister_memory(src)", lambda: t.unregister_memory(mem))

    def with_block() -> None:
        with t:
            pass                                     # leaving the block calls close() with the default timeout

    timed(ev, f"with transport: ...  (close() at the end, default timeout {op_timeout:g} s)", with_block)
    print(f"after the failed close: connected() = {t.connected()}")
    timed(ev, "register_memory(new tensor)", lambda: t.register_memory(torch.zeros(4)))
    timed(ev, f"close(timeout={op_timeout:g}) again", lambda: t.close(timeout=op_timeout))
    held = {"registrations": len(t._registrations), "closed": t._closed, "closing": t._closing}  # private
    print(f"still held after two failed closes: {held['registrations']} registration(s); closed={held['closed']}")
    results.update({"events": ev, "work": state, "held": held, "connected": t.connected()})
    report(results)
    dist.destroy_process_group()
    # The transport cannot release memory a transfer may still touch; leave without running its finalizers.
    os._exit(0)


def bootstrap_case(rank: int, store: dist.Store) -> dict[str, Any]:
    """Rank 0 pairs with a rank that never comes: what the bootstrap's timeout says."""
    if rank != 0:
        return {}
    try:
        pair(5, rank=0, store=store, timeout=0.5, agent_name="lonely")
    except TimeoutError as e:
        cause = describe(e.__cause__) if e.__cause__ else ""
        print(f"pair(peer_rank=5) -> {describe(e)}\n  caused by {cause}")
        return {"bootstrap": describe(e), "cause": cause}
    return {"bootstrap": "connected (!)"}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=[*CASES, "all"], default="all")
    p.add_argument("--op-timeout", type=float, default=0.5, help="timeout of the transfers that must fail")
    a = p.parse_args(argv)
    if not 0 < a.op_timeout <= TIMEOUT:
        p.error(f"--op-timeout must be in (0, {TIMEOUT:g}] seconds, got {a.op_timeout}")
    quiet_nixl()
    # UCX logs its refused reconnects to a dead peer on stdout, with timestamps and ports; NIXL's own
    # "was disconnected" line (stderr) still says what happened.
    os.environ.setdefault("UCX_LOG_LEVEL", "fatal")
    rank = init_rank("gloo").rank
    store = dist.distributed_c10d._get_default_store()
    cases = CASES if a.case == "all" else (a.case,)
    t = pair(1 - rank, rank=rank, timeout=TIMEOUT, op_timeout=a.op_timeout, agent_name=f"failures-rank{rank}")
    out: dict[str, Any] = {}
    if "timeout" in cases:
        out["timeout"] = timeout_case(t, rank, store)
    if "early-unregister" in cases:
        out["early"] = early_unregister_case(t, rank, store)
    if a.case == "all":
        out.update(bootstrap_case(rank, store))
    if "progress" in cases:
        out["progress"] = progress_case(rank, store, a.op_timeout)
    if "dead-peer" in cases:
        dead_peer_case(t, rank, store, a.op_timeout, out)  # does not return
        return 1
    dist.barrier()
    t.close(timeout=TIMEOUT)
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    if "progress" in cases:
        os._exit(0)  # the stuck pair of the progress case can never be closed: leave without its finalizers
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
