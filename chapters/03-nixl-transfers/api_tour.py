"""The `torch.distributed._transport` API end to end across two processes (chapter 3).

    torchrun --nproc-per-node 2 api_tour.py                 # both control planes, one after the other
    torchrun --nproc-per-node 2 api_tour.py --store tcp     # control plane: a TCPStore of its own
    torchrun --nproc-per-node 2 api_tour.py --store pg      # control plane: the process group's store

Rank 1 owns memory and does nothing with it after publishing descriptors: it only sleeps and looks.
Rank 0 writes and reads that memory one-sided: sync, async_op=True, and asyncio (read_async/write_async,
wait_all). With `--store both` the tour runs twice, through two endpoints paired in turn (the Nth
`new_transport_rank` call of each rank pairs with the other's Nth), and the results must be the same.
After the first tour, one round of each protocol is timed on both ranks for the chapter's timeline: a gloo
send + 1-byte ack (rank 1 must post a matching recv and answer) and a NIXL write (rank 1 makes no call; it
only notices that its memory changed). The timestamps are `time.monotonic()`, one clock for all processes of
a Linux host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.transport import control_store, describe, fetch, pair, publish, quiet_nixl, wait_key

TIMEOUT = 20.0
ROUND_BYTES = 2**20  # the timed round's message


def owner(t: Any, ctl: dist.Store, say: Any = print) -> dict[str, Any]:
    """Rank 1: register and publish memory, then make no transport call; only sleep and look."""
    inbox = torch.zeros(16)                                   # rank 0 writes here
    table = 100 + torch.arange(16, dtype=torch.float32)       # rank 0 reads this
    shards = [200 + 4 * i + torch.arange(4, dtype=torch.float32) for i in range(4)]
    mems = {"inbox": t.register_memory(inbox), "table": t.register_memory(table)}
    mems.update({f"shard{i}": t.register_memory(s) for i, s in enumerate(shards)})
    for name, mem in mems.items():
        publish(ctl, f"tour/{name}", mem)
    say("registered and published inbox, table, shard0..3; now only sleeping and looking")
    # No transport call from here on: this loop reads its own tensor and sleeps.
    deadline = time.monotonic() + TIMEOUT
    while inbox[0].item() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    say(f"inbox changed while this rank only slept: {inbox[0].item() != 0}")
    wait_key(ctl, "tour/done", timeout=TIMEOUT)                # rank 0 says it has stopped touching us
    say(f"inbox now  {inbox.tolist()}")
    say(f"shards now {[s.tolist() for s in shards]}")
    out = {"inbox": inbox.tolist(), "shards": [s.tolist() for s in shards]}
    for mem in mems.values():
        t.unregister_memory(mem)
    return out


def initiator(t: Any, ctl: dist.Store, say: Any = print) -> dict[str, Any]:
    """Rank 0: one-sided writes and reads of rank 1's memory, sync, async_op=True and asyncio."""
    from torch.distributed._transport import wait_all
    from torch.distributed._transport.nixl import NIXLRemoteBuffer

    src = torch.arange(16, dtype=torch.float32)
    local = torch.zeros(16)
    src_mem, local_mem = t.register_memory(src), t.register_memory(local)
    inbox, table = fetch(ctl, "tour/inbox", timeout=TIMEOUT), fetch(ctl, "tour/table", timeout=TIMEOUT)
    raw = inbox.serialize()
    fields = json.loads(raw)["fields"]
    say(f"descriptor: JSON (version {json.loads(raw)['version']}) with fields {sorted(fields)}")
    say(f"  memory_type={fields['memory_type']} length={fields['length']} bytes, agent={fields['agent_name']}")
    assert NIXLRemoteBuffer.deserialize(raw) == inbox

    rc = t.write(src_mem.to_view(), inbox)                       # sync: returns when the bytes are there
    say(f"write(whole src) -> {rc}")
    rc = t.read(local_mem.to_mutable_view(), table)              # sync read of the peer's table
    say(f"read(table) -> {rc}; local = {local[:4].tolist()} ...")

    work = t.write(src_mem.to_view(32, 16), inbox, async_op=True)  # bytes 32..47 = src[8:12]
    say(f"write(src bytes 32..47, async_op=True) -> {type(work).__name__}; wait() -> {work.wait()}")
    work = t.read(local_mem.to_mutable_view(48, 16), table, async_op=True)  # into local[12:16]
    work.wait()
    say(f"read(into local bytes 48..63, async_op=True) done: is_completed={work.is_completed()}")
    say(f"local = {local.tolist()}")

    shard_bufs = [fetch(ctl, f"tour/shard{i}", timeout=TIMEOUT) for i in range(4)]
    gathered = torch.zeros(16)
    g_mem = t.register_memory(gathered)

    async def gather_and_scale() -> None:
        # Four one-sided reads in flight at once, each into its own 16-byte range of `gathered`.
        await asyncio.gather(*(t.read_async(g_mem.to_mutable_view(16 * i, 16), shard_bufs[i])
                               for i in range(4)))
        gathered.mul_(-1)
        # Back again: shards 0-1 with the write_async coroutine, shards 2-3 as Work objects + wait_all.
        works = [t.write(g_mem.to_view(16 * i, 16), shard_bufs[i], async_op=True) for i in (2, 3)]
        await asyncio.gather(*(t.write_async(g_mem.to_view(16 * i, 16), shard_bufs[i]) for i in (0, 1)),
                             wait_all(works, timeout=TIMEOUT))

    asyncio.run(gather_and_scale())
    say(f"read_async x4 gathered and negated: {gathered.tolist()}")
    say("written back: shards 0-1 with write_async, shards 2-3 with write(async_op=True) + wait_all")

    t.unregister_memory(src_mem)
    try:
        src_mem.to_view()
    except RuntimeError as e:
        say(f"after unregister_memory: {describe(e)}")
    out = {"local": local.tolist(), "gathered": gathered.tolist()}
    ctl.set("tour/done", b"1")
    return out


def timed_round(t: Any, ctl: dist.Store, rank: int) -> dict[str, float]:
    """One gloo send + ack and one NIXL write of ROUND_BYTES, with each rank's timestamps (time.monotonic)."""
    now = time.monotonic
    buf = torch.zeros(ROUND_BYTES, dtype=torch.uint8)
    ack = torch.zeros(1, dtype=torch.uint8)
    out: dict[str, float] = {}
    if rank == 1:
        landing = t.register_memory(buf)
        publish(ctl, "round/landing", landing)
        ctl.set("round/receiving", b"1")
        out["recv"] = now()
        dist.recv(buf, src=0)                                   # two-sided: rank 1 must be in this call
        out["received"] = now()
        dist.send(ack, dst=0)
        out["ack_sent"] = now()
        buf.zero_()
        ctl.set("round/watching", b"1")
        deadline = now() + TIMEOUT
        while buf[-1].item() == 0 and now() < deadline:         # one-sided: no call, it only looks
            time.sleep(0.0002)
        out["seen"] = now()
        wait_key(ctl, "round/done", timeout=TIMEOUT)
        t.unregister_memory(landing)
    else:
        buf.fill_(1)
        src = t.register_memory(buf)
        remote = fetch(ctl, "round/landing", timeout=TIMEOUT)
        wait_key(ctl, "round/receiving", timeout=TIMEOUT)
        out["send"] = now()
        dist.send(buf, dst=1)
        out["sent"] = now()
        dist.recv(ack, src=1)                                   # the sender learns of delivery from the ack
        out["acked"] = now()
        wait_key(ctl, "round/watching", timeout=TIMEOUT)
        out["write"] = now()
        t.write(src.to_view(), remote)                          # returns when the bytes are in rank 1's buffer
        out["written"] = now()
        ctl.set("round/done", b"1")
        t.unregister_memory(src)
    return out


def tour(rank: int, via: str, *, first: bool) -> dict[str, Any]:
    """Pair through the chosen store, run the tour (the first also the timed round), close; return the results."""
    store = control_store(rank, timeout=TIMEOUT, key=f"pt215/control_store/{via}") if via == "tcp" else None
    ctl = store if store is not None else dist.distributed_c10d._get_default_store()
    t = pair(1 - rank, rank=rank, store=store, timeout=TIMEOUT, agent_name=f"tour-{via}-rank{rank}")
    print(f"connected through the {'TCPStore' if via == 'tcp' else 'process group store'}: {t.connected()}")
    say = print if first else (lambda *_: None)  # a second tour repeats the first: it says only that it ran
    out = owner(t, ctl, say) if rank == 1 else initiator(t, ctl, say)
    if first:
        out["round"] = timed_round(t, ctl, rank)
    # Coordinate before closing: neither side may close while the other could still touch its memory.
    dist.barrier()
    t.close(timeout=TIMEOUT)
    print(f"closed: connected() = {t.connected()}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["tcp", "pg", "both"], default="both")
    a = p.parse_args(argv)
    quiet_nixl()
    from torch.distributed._transport import available_transports

    rank = init_rank("gloo").rank
    if rank == 0:
        print(f"available_transports() = {available_transports()}")
    vias = ["tcp", "pg"] if a.store == "both" else [a.store]
    out = {via: tour(rank, via, first=i == 0) for i, via in enumerate(vias)}
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
