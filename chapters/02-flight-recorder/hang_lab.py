"""The hang lab (chapter 2): break a small gloo job on purpose and collect a flight-recorder dump from every rank.

    torchrun --nproc-per-node 3 hang_lab.py --case skip --dump-dir fr_dumps/skip

Cases (3 ranks unless noted; the culprit is the last rank unless --culprit says otherwise):
  healthy    no fault: the run ends normally (and dumps on demand at the end)
  skip       the culprit skips the gradient all_reduce (world group) and goes on to the metrics all_reduce
  order      the culprit issues the metrics all_reduce before the gradient all_reduce (ABBA deadlock)
  mismatch   the culprit calls broadcast where the others call all_reduce
  straggler  the culprit is stuck in compute and never reaches the step's collectives
  subgroup   4 ranks in two pairs; the culprit skips its pair's all_reduce and goes on to the world all_reduce

Each step is: [pair all_reduce (subgroup case only)], all_reduce(grad) on the world group, then
all_reduce(stats) on a second group over all ranks, "metrics" (as a metrics/logging group would be).

Every rank arms torch's Python watchdog (`torch.distributed._watchdog.cpu_timeout`) around the faulty step;
when it fires (`--dump-after` seconds in), the rank writes its flight-recorder dump to `<dump-dir>/rank_<rank>`
(through TORCH_FR_DUMP_TEMP_FILE), the stuck rank included. Then it waits until every rank's file exists
(bounded), reports and leaves, so a launch ends about `--dump-after` seconds after the hang, long before the
collective timeout (`--timeout`, 30 s). A rank whose collective fails first (`--timeout` shorter than
`--dump-after`, or TORCH_DISTRIBUTED_DEBUG=DETAIL's check) dumps at once, prints the error and leaves the same way.

Health while it hangs: every rank also serves torch's per-rank debug handlers (`_WorkerServer`) on a
Unix socket; when rank 0's watchdog fires it asks every rank for `c10d_health_check` and `dump_traceback`
and prints where each rank's main thread is in this script.

`--stacks` writes the dumps with Python frames (each entry then says which line of this script issued it);
their file names are written relative to the site-packages folder or to this script's folder, so a dump
names no machine's folders. `--rank-env R:NAME=VALUE` (repeatable) sets NAME=VALUE on rank R only, before
the process group exists: a rank-dependent environment, such as one node with `TORCH_FR_BUFFER_SIZE=0`.

With `--backend nccl` (>= 2 GPUs) nothing is armed and nothing is dumped by this script unless `--py-watchdog`
is given: the dumps come from the backend itself (TORCH_FR_DUMP_ON_TIMEOUT / TORCH_NCCL_DUMP_ON_TIMEOUT). NCCL collectives return
once queued, so after the faulty step every rank waits for its GPU stream (`torch.cuda.synchronize`): the stuck
collective keeps it there until the backend times it out, dumps and tears the process down (a non-zero exit is
expected). Which recorder holds the entries: `nccl` in 2.15 is ProcessGroupNCCL2, recorded through the c10d
hook into the ring "nccl2", dumped with `_dump_fr_trace_file(..., backend="nccl2")`; the legacy ProcessGroupNCCL
(`TORCH_DIST_USE_NCCL2=0`) records into its own CUDA-event recorder, which only `_dump_nccl_trace()` reads.
Unverified on hardware.
"""

from __future__ import annotations

import argparse
import http.client
import json
import linecache
import os
import pickle
import re
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
from torch.distributed import _watchdog

from pt215.flight import apply_rank_env
from pt215.launch import init_rank, report, shutdown

CASES = ("healthy", "skip", "order", "mismatch", "straggler", "subgroup")
WARMUP_STEPS = 3
N = 1024  # gradient bucket size (float32 elements)
LEGACY = "nccl-legacy"  # not a ring name: the legacy ProcessGroupNCCL's recorder, read by _dump_nccl_trace()


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=CASES, required=True)
    p.add_argument("--dump-dir", default="fr_dumps", help="folder for the dumps (TORCH_FR_DUMP_TEMP_FILE prefix)")
    p.add_argument("--dump-after", type=float, default=2.0, help="seconds stuck before every rank dumps")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="collective timeout of the process groups, seconds (the watchdog dumps long before it)")
    p.add_argument("--culprit", type=int, default=-1, help="the faulty rank (default: the last rank)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--py-watchdog", action="store_true", help="with nccl: arm the Python watchdog dumps too")
    p.add_argument("--stacks", action="store_true", help="dump with Python frames (file names made relative)")
    p.add_argument("--rank-env", action="append", default=[], metavar="R:NAME=VALUE",
                   help="set NAME=VALUE on rank R only, before init_process_group (repeatable)")
    a = p.parse_args(argv)
    for name in ("dump_after", "timeout"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(a, name)}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    try:
        overrides = apply_rank_env(a.rank_env, int(os.environ.get("RANK", "0")))
    except ValueError as e:
        raise SystemExit(f"hang_lab.py: error: --rank-env: {e}") from None
    out = Path(a.dump_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Must be set before the first dump: the dump file is <prefix><rank>.
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(out / "rank_")
    nccl = a.backend == "nccl"
    # nccl: cuda:LOCAL_RANK is made current but not bound as device_id, so each communicator is created at
    # its group's first collective; gloo: the CPU.
    me = init_rank(a.backend, timeout_s=a.timeout, bind_device=False)
    rank, world = me.rank, me.world
    dev = me.device
    if overrides:
        print("environment of this rank: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    fr_backend = fr_ring(dev) if nccl else "gloo"
    server = c10d._WorkerServer(str(out / f".w{rank}.sock"), -1)  # per-rank debug handlers on a Unix socket
    culprit = a.culprit % world
    metrics = dist.new_group(list(range(world)), group_desc="metrics")
    pairs = ([dist.new_group([r, r + 1], group_desc=f"pair{r // 2}") for r in range(0, world - 1, 2)]
             if a.case == "subgroup" else [])
    my_pair = pairs[rank // 2] if pairs else None
    torch.manual_seed(rank)
    grad, stats = torch.ones(N, device=dev), torch.zeros(4, device=dev)

    dumped, departing = threading.Event(), threading.Event()  # departing: set before the watchdog's dump
    lock, leaving = threading.Lock(), threading.Lock()
    info: dict[str, float | str | None] = {}

    def dump(reason: str) -> None:
        with lock:
            if dumped.is_set():
                return
            if rank == 0 and reason == "watchdog":
                ask_every_rank(out, world)
            target = out / f"rank_{rank}"
            if fr_backend == LEGACY:  # the legacy ProcessGroupNCCL's own recorder: written by hand
                target.write_bytes(c10d._dump_nccl_trace(includeStackTraces=a.stacks))
            else:
                c10d._dump_fr_trace_file(rank, includeStackTraces=a.stacks, backend=fr_backend)
            if a.stacks:
                relative_frames(target)
            info.update(dump_time=time.time(), dump_reason=reason)
            dumped.set()

    def leave(outcome: str) -> None:
        """Once this rank has dumped: wait (bounded) until every rank's file exists, report, and exit."""
        with leaving:  # the first caller leaves; a second one (the other thread) waits here until the exit
            files = [out / f"rank_{r}" for r in range(world)]
            end = time.monotonic() + a.dump_after + 30
            while not all(f.exists() for f in files) and time.monotonic() < end:
                time.sleep(0.05)
            dumped.wait(a.dump_after + 30); finish(outcome)  # noqa: E702 (the dump's reason is set after its file)

    def finish(outcome: str) -> None:
        print(f"outcome: {outcome}; dump written by: {info.get('dump_reason', 'nobody')}")
        out_file = out / f"rank_{rank}"
        report({"rank": rank, "outcome": outcome, "dump_reason": info.get("dump_reason"),
                "error_kind": info.get("error_kind"), "hang_start": info["hang_start"],
                "dump_time": info.get("dump_time"),
                "dump_bytes": out_file.stat().st_size if out_file.exists() else 0})
        server.shutdown()
        if a.case == "healthy":
            shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
            return
        # The group is broken: destroy_process_group() could block on a dead peer. Leave at once.
        os._exit(0)

    def on_watchdog() -> None:
        departing.set(); dump("watchdog")  # noqa: E702 (one line: this file's line numbers are in stored stacks)
        leave("stuck in compute" if is_culprit and a.case == "straggler" else "hung in the step")

    def healthy_step() -> None:
        if my_pair is not None:
            dist.all_reduce(grad, group=my_pair)  # e.g. tensor-parallel pair
        dist.all_reduce(grad)                      # gradient sync over all ranks
        dist.all_reduce(stats, group=metrics)      # loss/metrics

    for _ in range(WARMUP_STEPS):
        healthy_step()
    if a.stacks and not nccl:
        # The first dump with frames imports torch's compiler stack to name them (seconds), and cannot finish from
        # the watchdog's thread while the main thread waits in a collective: pay it here, in the main thread.
        c10d._dump_fr_trace()
    dist.barrier()
    print(f"warm-up done: {WARMUP_STEPS} healthy steps")

    is_culprit = rank == culprit and a.case != "healthy"
    info["hang_start"] = time.time()
    armed = (not nccl or a.py_watchdog) and a.case != "healthy"
    handle = _watchdog.cpu_timeout(a.dump_after, on_watchdog) if armed else None
    # unarmed (nccl), the straggler stays stuck past the collective timeout; armed, its watchdog ends it
    deadline = time.monotonic() + (a.dump_after + 60 if armed else a.timeout + 2)
    try:
        if a.case == "healthy":
            healthy_step()
        elif a.case == "skip":
            if not is_culprit:
                dist.all_reduce(grad)         # the culprit "has no gradients this step" ...
            dist.all_reduce(stats, group=metrics)  # ... and goes straight on to the metrics
        elif a.case == "order":
            if is_culprit:
                dist.all_reduce(stats, group=metrics)
                dist.all_reduce(grad)
            else:
                dist.all_reduce(grad)
                dist.all_reduce(stats, group=metrics)
        elif a.case == "mismatch":
            if is_culprit:
                dist.broadcast(grad, src=0)   # "I am not the owner, so I receive"
            else:
                dist.all_reduce(grad)
            dist.all_reduce(stats, group=metrics)
        elif a.case == "straggler":
            if is_culprit:
                x = torch.randn(64, 64, device=dev)
                while time.monotonic() < deadline: x = torch.tanh(x @ x)  # noqa: E701 (one line: one stack)
            else:
                healthy_step()
        elif a.case == "subgroup":
            if not is_culprit:
                dist.all_reduce(grad, group=my_pair)
            dist.all_reduce(grad)
            dist.all_reduce(stats, group=metrics)
        if nccl:
            torch.cuda.synchronize(dev)  # NCCL calls return once queued: wait here, where a hang really hangs
    except RuntimeError as e:  # once departing, a failure is a peer leaving after every dump: wait to exit, silent
        text = str(e) if not departing.is_set() else leave("hung in the step")  # (leave() does not return then)
        info["error_kind"] = "timeout" if "Timed out" in text else "peer gone" if "Connection" in text else "error"
        print(f"error: {short_error(text)}")
        if armed:  # unarmed nccl: only the backend writes dumps (what its cells and checks look for)
            dump("exception")
        (leave if armed else finish)("collective failed")
    if a.case == "healthy":
        dist.barrier()
        dump("on demand")
        finish("completed")
        return 0
    if armed:  # this rank got through the step: its watchdog still dumps it, and leaves
        dumped.wait(a.dump_after + 30)
        leave("completed")
    if handle is not None:
        handle.cancel()
    finish("completed")  # unarmed nccl: the step returned on this rank
    return 0


def fr_ring(dev: torch.device) -> str:
    """Where the world group's NCCL backend records: the ring "nccl2" (ProcessGroupNCCL2, through the c10d
    hook), or LEGACY (ProcessGroupNCCL's CUDA-event recorder; `backend="nccl"` would name an empty ring)."""
    impl = type(dist.get_backend_impl(dist.group.WORLD, dev)).__name__
    return "nccl2" if impl == "ProcessGroupNCCL2" else LEGACY


def relative_frames(path: Path) -> None:
    """Rewrite a dump's frame file names relative to site-packages or to this script's folder (no machine paths)."""
    here = os.path.dirname(os.path.abspath(__file__))
    trace = pickle.loads(path.read_bytes())
    for e in trace.get("entries", []):
        for f in e.get("frames") or ():
            name = f.get("filename", "")
            if "site-packages/" in name:
                f["filename"] = name.split("site-packages/", 1)[1]
            elif name.startswith(here + os.sep):
                f["filename"] = os.path.relpath(name, here)
            elif os.path.isabs(name):
                f["filename"] = os.path.basename(name)
    path.write_bytes(pickle.dumps(trace))


def short_error(text: str) -> str:
    """The first line of a collective's error; for TORCH_DISTRIBUTED_DEBUG=DETAIL's check, what differed."""
    m = re.search(r"Collectives differ in the following aspects:\s*(.*)", text, flags=re.S)
    if m:
        ranks = re.findall(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                           r"OpType=(\w+), TensorShape=\[([^\]]*)\]", text)
        other = re.search(r"but Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                          r"OpType=(\w+), TensorShape=\[([^\]]*)\]", text)
        mine = f"this rank {ranks[0][1]} [{ranks[0][2]}]" if ranks else "this rank"
        theirs = f"rank {other.group(1)} {other.group(2)} [{other.group(3)}]" if other else "a peer"
        return f"Detected mismatch between collectives: {mine}, {theirs} ({' '.join(m.group(1).split())})"
    first = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]  # without gloo's "[source file:line]" prefix


def _post(sock: Path, handler: str, timeout: float = 5.0) -> str:
    """POST /handler/<name> to a rank's worker server listening on a Unix socket."""

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(timeout)
            self.sock.connect(str(sock))

    c = Conn("localhost", timeout=timeout)
    try:
        c.request("POST", f"/handler/{handler}")
        return c.getresponse().read().decode(errors="replace")
    finally:
        c.close()


def _where_in_script(traceback_text: str) -> str:
    """The innermost line of this script in the main thread's stack, from `dump_traceback`'s text."""
    me = os.path.basename(__file__)
    for block in traceback_text.split("\n\n"):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        ours = [(f, int(n), fn) for f, n, fn in frames if os.path.basename(f) == me]
        if ours and ours[-1][2] == "<module>":
            f, n, fn = ours[0]
            return f"{fn}() line {n}: {linecache.getline(f, n).split('#')[0].strip()}"
    return "not found"


def ask_every_rank(out: Path, world: int) -> None:
    """Rank 0, while the job hangs: every rank's health check and where its main thread is."""
    for r in range(world):
        sock = out / f".w{r}.sock"
        try:
            health = json.loads(_post(sock, "c10d_health_check"))
            where = _where_in_script(_post(sock, "dump_traceback"))
            print(f"debug handlers of rank {r}: healthy={health.get('healthy')}; main thread at {where}")
        except (OSError, ValueError) as e:
            print(f"debug handlers of rank {r}: no answer ({type(e).__name__})")


if __name__ == "__main__":
    raise SystemExit(main())
