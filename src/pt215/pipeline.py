"""Pipeline parallelism in 2.15: live-byte accounting and reading a lowered schedule (chapter 8).

`LiveBytes` counts the bytes of tensors that are still alive (a `weakref.finalize` on each one subtracts its
bytes when the tensor is freed) and keeps the peak; `track_pipeline_memory` installs it on the two places
2.15's pipelining creates per-microbatch tensors: the receive buffer `_RecvInfo.allocate_buffer` makes just
before each receive, and each stage's forward output. `action_rows` and `unshard_positions` read a schedule's
lowered action lists (`pipeline_order_with_comms`), which every rank holds for every rank.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["LiveBytes", "track_pipeline_memory", "action_rows", "unshard_positions", "action_counts"]


class LiveBytes:
    """Bytes of tracked tensors still alive, per kind ("recv", "output"); the peak of their sum and of each kind."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.peak = 0
        self.peak_by_kind: dict[str, int] = {}
        self.allocations: dict[str, int] = {}
        self._seen: set[int] = set()

    @property
    def total(self) -> int:
        """Bytes alive now, all kinds together."""
        return sum(self.live.values())

    def add(self, tensor: Any, kind: str) -> None:
        """Count `tensor`'s storage bytes under `kind` until it is freed (a tensor is counted once)."""
        import torch

        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"add(): tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"add(): kind must be a non-empty name such as 'recv', got {kind!r}")
        key = id(tensor)
        if key in self._seen:
            return
        nbytes = tensor.numel() * tensor.element_size()
        self._seen.add(key)
        self.live[kind] = self.live.get(kind, 0) + nbytes
        self.allocations[kind] = self.allocations.get(kind, 0) + 1
        self.peak = max(self.peak, self.total)
        self.peak_by_kind[kind] = max(self.peak_by_kind.get(kind, 0), self.live[kind])
        weakref.finalize(tensor, self._free, key, kind, nbytes)

    def _free(self, key: int, kind: str, nbytes: int) -> None:
        self._seen.discard(key)
        self.live[kind] -= nbytes

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now (call between steps)."""
        self.peak = self.total
        self.peak_by_kind = dict(self.live)
        self.allocations = {}


@contextlib.contextmanager
def track_pipeline_memory(stages: Sequence[Any], tracker: LiveBytes) -> Iterator[LiveBytes]:
    """Count receive buffers (at allocation, 2.15's `_RecvInfo.allocate_buffer`) and stage outputs in `tracker`."""
    from torch.distributed.pipelining import _recv_buffers

    original = _recv_buffers._RecvInfo.allocate_buffer

    def allocate_buffer(self, device):
        buffer = original(self, device)
        tracker.add(buffer, "recv")
        return buffer

    def count_output(_module, _args, output):
        for t in output if isinstance(output, tuple | list) else (output,):
            tracker.add(t, "output")

    handles = [stage.submod.register_forward_hook(count_output) for stage in stages]
    _recv_buffers._RecvInfo.allocate_buffer = allocate_buffer
    try:
        yield tracker
    finally:
        _recv_buffers._RecvInfo.allocate_buffer = original
        for handle in handles:
            handle.remove()


def action_rows(order: Mapping[int, Sequence[Any]]) -> dict[int, list[str]]:
    """Each rank's lowered actions as short strings ("0F3" = stage 0 forward of microbatch 3, "1UNSHARD")."""
    if not isinstance(order, Mapping):
        raise ValueError(f"action_rows(): order must map rank -> actions (pipeline_order_with_comms), got "
                         f"{type(order).__name__}")
    return {rank: [str(a) for a in actions if a is not None] for rank, actions in sorted(order.items())}


def unshard_positions(rows: Mapping[int, Sequence[str]]) -> dict[int, list[int]]:
    """Per rank, the number of compute actions (F/B/I/W) that run before each UNSHARD: where the fetches sit."""
    out: dict[int, list[int]] = {}
    for rank, actions in rows.items():
        computed, positions = 0, []
        for name in actions:
            if name.endswith("UNSHARD"):
                positions.append(computed)
            elif _is_compute(name):
                computed += 1
        out[rank] = positions
    return out


def _is_compute(name: str) -> bool:
    """'2F5', '2B5', '2I5', '2W5' (stage, kind, microbatch); communication actions have longer kinds."""
    digits = name.rstrip("0123456789")
    kind = digits.lstrip("0123456789")
    return kind in {"F", "B", "I", "W"} and digits != name


def action_counts(rows: Mapping[int, Sequence[str]], kinds: Sequence[str]) -> dict[int, dict[str, int]]:
    """Per rank, how many actions of each kind (e.g. 'SEND_F', 'RECV_F', 'UNSHARD') the lowered schedule holds."""
    out: dict[int, dict[str, int]] = {}
    for rank, actions in rows.items():
        out[rank] = {k: sum(1 for a in actions if a.lstrip("0123456789").rstrip("0123456789") == k) for k in kinds}
    return out
