"""The debug server during a hang (chapter 2, notebook 2.5): every rank's flight recorder, from one request.

    torchrun --nproc-per-node 3 debug_server.py --dump-dir fr_debug --port 25999

Every rank calls `torch.distributed.debug.start_debug_server(...)`: a worker server per rank (the C++
`_WorkerServer`, on an ephemeral port, announced in the rendezvous store) and, on rank 0 only, the frontend
process, which serves HTTP on `--port`, writes periodic dumps into `--dump-dir` (`--interval` seconds apart)
and fans each request out to every rank's worker server.

After three healthy steps the last rank gets stuck in compute (a straggler) while the others wait in the
gradient all_reduce; on gloo it computes until rank 0 has asked every rank (at most `--stuck` seconds), so what
rank 0 collects is always taken during the hang. When rank 0's Python watchdog fires (`--dump-after` seconds into
the step), it does what the frontend does for a page: `fetch_all(...)` POSTs one handler to every rank's worker server (the straggler
included). `fr_trace_json` returns each rank's flight recorder, saved as `<dump-dir>/rank_<r>.json`;
`fr_dump_file` (the handler the health check calls on NCCL2) and `c10d_health_check` show what gloo answers.
The frontend's periodic dumps (`stacks_*.txt`, `c10d_health_check_*.txt`, ...) go to `<dump-dir>/periodic`.
The straggler then arrives, the step completes, and the job ends cleanly.

With `--backend nccl` (>= 2 GPUs) the straggler outlasts `--timeout` (so `--stuck` > `--timeout` there); NCCL2's
watchdog marks the backend unhealthy and the frontend's periodic health round asks every rank for
`fr_dump_file?backend=nccl2`. `work.wait()` on NCCL2 only makes the current CUDA stream wait for the collective
(torch/csrc/distributed/c10d/nccl2/WorkNCCL.hpp, `synchronizeInternal`, lines 184-186), so a waiting rank polls
`work.is_completed()` on the host for the real outcome; and every rank stays until every rank's file exists,
so rank 0's frontend is still alive for the health round that asks the straggler.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.debug as debug
from torch.distributed import _watchdog
from torch.distributed.debug._frontend import fetch_all

from pt215 import flight
from pt215.launch import init_rank, report, shutdown

N = 1024
ASKED = "debug_server/asked"  # set by rank 0 in the store once it has asked every rank


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump-dir", default="fr_debug", help="folder for the periodic dumps and the rank_<r> files")
    p.add_argument("--port", type=int, default=0, help="frontend HTTP port on rank 0 (0: pick a free one)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="nccl (>= 2 GPUs): no watchdog fan-out; the straggler outlasts --timeout and NCCL2's "
                        "health report makes the frontend ask every rank for fr_dump_file")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between the frontend's periodic dumps")
    p.add_argument("--dump-after", type=float, default=2.0, help="seconds stuck before rank 0 asks for dumps")
    p.add_argument("--stuck", type=float, default=30.0,
                   help="gloo: at most this long the straggler computes (it joins once rank 0 has asked every rank); "
                        "nccl: how long it computes")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout of the group, seconds")
    a = p.parse_args(argv)
    for name in ("interval", "dump_after", "stuck", "timeout"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(a, name)}")
    if a.backend == "gloo" and not a.dump_after < a.stuck < a.timeout:
        p.error(f"gloo needs --dump-after ({a.dump_after}) < --stuck ({a.stuck}) < --timeout ({a.timeout}): the "
                "watchdog asks while the straggler computes, and it arrives before the collective times out")
    if a.backend == "nccl" and not a.timeout < a.stuck:
        p.error(f"nccl needs --timeout ({a.timeout}) < --stuck ({a.stuck}): the straggler must outlast the "
                "collective timeout so that NCCL2's watchdog marks the backend unhealthy")
    return a


def free_port() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 30.0) -> tuple[int, str]:
    """GET a page of the frontend on this host; returns (status, body)."""
    with urllib.request.urlopen(f"http://localhost:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


def wait_for_frontend(port: int, deadline: float) -> None:
    while True:
        try:
            get(port, "/", timeout=2.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"debug frontend on port {port} did not answer") from None
            time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    out = Path(a.dump_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(out / "rank_")  # what fr_dump_file writes: <prefix><rank>
    nccl = a.backend == "nccl"
    me = init_rank(a.backend, timeout_s=a.timeout)  # nccl: cuda:LOCAL_RANK, bound as device_id
    rank, world, dev = me.rank, me.world, me.device
    straggler = world - 1

    port = [a.port or free_port()]
    dist.broadcast_object_list(port, src=0)  # every rank needs the frontend's port (only rank 0 uses it here)
    debug.start_debug_server(port=port[0], worker_port=0, start_method="spawn",
                             dump_dir=str(out / "periodic"), dump_interval=a.interval)
    if rank == 0:
        wait_for_frontend(port[0], time.monotonic() + 60)
    dist.barrier()  # every worker server is announced before anyone asks

    grad = torch.ones(N, device=dev)
    for _ in range(3):
        dist.all_reduce(grad)
    dist.barrier()
    print("warm-up done: 3 healthy steps")

    asked = threading.Event()
    fanout: dict[str, object] = {}
    store = dist.distributed_c10d._get_default_store()

    def ask_every_rank() -> None:
        """Rank 0's watchdog callback: collect every rank's flight recorder through the worker servers."""
        t0 = time.monotonic()
        waiting = [r for r in range(world) if r != straggler]
        for _ in range(8):
            # what the frontend's /fr_trace_json page does: POST to every worker announced in the store
            _, resps = fetch_all("fr_trace_json", "backend=gloo", timeout=30.0)
            for r, resp in enumerate(resps):
                if resp.status_code == 200:
                    (out / f"rank_{r}.json").write_text(resp.text)
            # gloo marks a collective completed shortly after it returns: on a busy machine the first answer
            # can still show the barrier before the all_reduce as running. Ask again until it has caught up.
            try:
                position = flight.diagnose(out).position
            except flight.DumpError:
                position = {}
            if all("all_reduce" in position.get(r, "") for r in waiting):
                break
            time.sleep(0.25)
        fanout["fr_trace_json"] = [resp.status_code for resp in resps]
        fanout["seconds"] = time.monotonic() - t0
        # the file-writing handler the health check uses on NCCL2; on gloo it cannot name the file
        _, resps = fetch_all("fr_dump_file", "backend=gloo", timeout=30.0)
        fanout["fr_dump_file"] = sorted({f"HTTP {r.status_code}: {r.text.strip()}" for r in resps})
        # the health every rank reports while the job hangs
        _, resps = fetch_all("c10d_health_check", timeout=30.0)
        fanout["c10d_health_check"] = sorted({r.text.strip() for r in resps})
        asked.set()
        store.set(ASKED, "1")  # the straggler may come now: everything above was taken while it computed

    if nccl:
        nccl_hang(a, rank, straggler, grad, out)  # does not return
    handle = _watchdog.cpu_timeout(a.dump_after, ask_every_rank) if rank == 0 else None
    if rank == straggler:  # computes until rank 0 has asked every rank (the state it reports), at most --stuck s
        deadline, check = time.monotonic() + a.stuck, 0.0
        x = torch.randn(64, 64)
        while time.monotonic() < deadline:
            x = torch.tanh(x @ x)
            if time.monotonic() > check:
                if store.check([ASKED]):
                    break
                check = time.monotonic() + 0.05
    dist.all_reduce(grad)  # the others wait here until the straggler arrives: a hang, while it lasts
    if handle is not None:
        handle.cancel()
        asked.wait(30)
        # let the frontend's periodic dumper finish one full round (its last handler is c10d_health_check)
        deadline = time.monotonic() + 30
        while not list((out / "periodic").glob("c10d_health_check_*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        fanout["periodic"] = sorted({f.name.rsplit("_", 2)[0] for f in (out / "periodic").glob("*.txt")})
    dist.barrier()
    ok = grad[0].item() == world ** 4  # 3 warm-up steps and this one, each multiplies by `world`
    print(f"step done after the straggler arrived; all_reduce correct: {ok}")
    report({"rank": rank, "fanout": fanout or None, "all_reduce_ok": ok})
    dist.barrier()
    if rank == 0:
        debug.stop_debug_server()       # the frontend process and this rank's worker server
    else:
        debug._WORKER_SERVER.shutdown()  # type: ignore[union-attr]  (only rank 0 has a frontend to stop)
    shutdown()  # barrier, every rank confirms through the store, then destroy_process_group()
    return 0


def nccl_hang(a: argparse.Namespace, rank: int, straggler: int, grad: torch.Tensor, out: Path) -> None:
    """NCCL2: the straggler outlasts the collective timeout; the others' watchdog marks nccl2 unhealthy.

    The frontend's next periodic c10d_health_check round then asks every rank for
    fr_dump_file?backend=nccl2, which writes <dump-dir>/rank_<r>. Every rank waits (bounded) until every rank's
    file exists: a waiting rank's abort hook writes its own file at once, and a rank that left then would take
    rank 0's frontend with it before the round that asks the straggler.
    """
    world = dist.get_world_size()
    deadline = time.monotonic() + a.stuck
    if rank == straggler:
        x = torch.randn(64, 64)
        mine = out / f"rank_{rank}"
        while time.monotonic() < deadline and not mine.exists(): x = torch.tanh(x @ x)  # noqa: E701
        outcome = "stuck in compute"
    else:
        work = dist.all_reduce(grad, async_op=True)
        work.wait()  # NCCL2: orders the current stream after the collective; the host does not wait
        end = time.monotonic() + a.timeout + a.stuck + 30
        while not work.is_completed() and time.monotonic() < end:
            time.sleep(0.1)
        if not work.is_completed():
            outcome = "still running"
        else:
            exc = work.exception()
            outcome = "completed" if exc is None else f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    files = [out / f"rank_{r}" for r in range(world)]
    end = time.monotonic() + 3 * a.interval + 60
    while not all(f.exists() for f in files) and time.monotonic() < end:
        time.sleep(0.2)
    written = [f.name for f in files if f.exists()]
    print(f"outcome: {outcome}; dump files written: {written}")
    report({"rank": rank, "outcome": outcome, "dump_files": written})
    os._exit(0)  # the communicator is aborted: no collective teardown


if __name__ == "__main__":
    raise SystemExit(main())
