"""Bytes a step hands to its collectives, counted with torch's CommDebugMode (the team's communication log), and
counted a second time by the book's counter (`pt215.fsdp.install_comm_counters`, FSDP2's own all-gather and
reduce-scatter wrapped), so that one count checks the other."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.tensor.debug import CommDebugMode

from pt215.fsdp import install_comm_counters

C10D = torch.ops.c10d
#: The collectives FSDP2 issues, and which argument is the input each rank hands over.
INPUTS = {C10D._allgather_base_: ("all_gather", 1), C10D._reduce_scatter_base_: ("reduce_scatter", 1),
          C10D.allreduce_: ("all_reduce", 0)}


class CommBytes(CommDebugMode):
    """CommDebugMode counts collectives; this also sums the bytes of each one's input, per kind, on this rank.

    Given the model, it also gives every FSDP2 unit the book's counting all-gather and reduce-scatter from here on,
    a second count of the same bytes that does not go through torch's dispatcher."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.bytes: dict[str, int] = defaultdict(int)
        self.counter = install_comm_counters(model) if model is not None else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = INPUTS.get(getattr(func, "_overloadpacket", None))
        if kind is not None:
            name, i = kind
            inputs = args[i] if isinstance(args[i], list | tuple) else [args[i]]
            self.bytes[name] += sum(t.numel() * t.element_size() for t in inputs)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def summary(self) -> str:
        text = (f"all_gather_bytes {self.bytes['all_gather']} reduce_scatter_bytes {self.bytes['reduce_scatter']} "
                f"collectives {self.get_total_counts()}")
        if self.counter is not None:
            counted = {k: sum(r.nbytes for r in self.counter.records if r.kind == k)
                       for k in ("all_gather", "reduce_scatter")}
            text += f" book_counter all_gather {counted['all_gather']} reduce_scatter {counted['reduce_scatter']}"
        return text
