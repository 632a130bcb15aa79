"""Which process-group class does each NCCL backend name build in torch 2.15? (chapter 1, notebook 1.2)

    python resolve_backend.py                          # the 2.15 default
    TORCH_DIST_USE_NCCL2=0 python resolve_backend.py   # the legacy fallback

Reads the backend registry (entry points, then Backend._plugins) and, with --init, tries each name in a
1-rank group so the error a machine without a GPU gives is shown. One process per setting: the
environment variable is read once, when "nccl" is first registered in the process. The script joins no
job: it only asks the registry, and `--init` tries each name on its own 1-rank group on purpose.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
from collections.abc import Sequence
from importlib.metadata import entry_points

import torch
import torch.distributed as dist
from torch.distributed import Backend
from torch.distributed import distributed_c10d as c10d

NAMES = ["nccl", "nccl-legacy", "nccl2", "nccl-lazy"]


def built_class(creator) -> str:
    """The process-group class a creator function constructs, read from its source (`ProcessGroupX(opts.store`)."""
    found = re.findall(r"(ProcessGroup\w+)\(\s*opts\.store", inspect.getsource(creator))
    return found[-1] if found else "?"


def resolved(name: str) -> str:
    """'creator -> class' for what the registry holds for `name` now."""
    creator = Backend._plugins[name.upper()].creator_fn
    return f"{creator.__name__} -> {built_class(creator)}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entry-points", action="store_true", help="list the torch.distributed.backends entry points")
    p.add_argument("--init", action="store_true", help="try init_process_group with each name (1 rank)")
    p.add_argument("--late", action="store_true", help="set TORCH_DIST_USE_NCCL2=0 after 'nccl' is registered")
    p.add_argument("--strings", action="store_true", help="call the nccl registrar with several values of the variable")
    a = p.parse_args(argv)

    print(f"TORCH_DIST_USE_NCCL2={os.environ.get('TORCH_DIST_USE_NCCL2', '(unset)')}")
    if a.entry_points:
        for ep in sorted(entry_points(group="torch.distributed.backends"), key=lambda e: e.name):
            print(f"  entry point {ep.name:<12} -> {ep.value}")
    print(f"registered at import: {sorted(Backend._plugins)}")
    for name in NAMES:
        Backend._ensure_backend_registered(name)  # what init_process_group(name) does first
        print(f"  {name:<12} -> {resolved(name)}")
    print(f"'nccl' records its own flight-recorder entries: {'nccl' in c10d._FR_SELF_RECORDING_BACKENDS}")

    if a.init:
        for name in NAMES:
            try:
                dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
                print(f"  init {name:<12} OK on {torch.cuda.device_count()} GPU(s)")
                dist.destroy_process_group()
            except Exception as e:  # noqa: BLE001 - we show the error a CPU-only machine gives
                print(f"  init {name:<12} {type(e).__name__}: {str(e).splitlines()[0]}")

    if a.late:
        os.environ["TORCH_DIST_USE_NCCL2"] = "0"  # too late: "nccl" is registered already
        Backend._ensure_backend_registered("nccl")
        print(f"after setting TORCH_DIST_USE_NCCL2=0 late: nccl -> {resolved('nccl')}")

    if a.strings:
        # The registrar reads the variable each time it runs; init_process_group runs it once per process.
        for value in ["0", "1", "false", "off", " 0", ""]:
            os.environ["TORCH_DIST_USE_NCCL2"] = value
            c10d._register_builtin_nccl_backend()
            print(f"  TORCH_DIST_USE_NCCL2={value!r:<8} -> nccl -> {resolved('nccl')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
