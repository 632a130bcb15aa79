"""CPU tensor memory, seen two independent ways: the allocator's own events, and what autograd saves.

Chapter 10 (notebook 10.1, the loss head) measures peaks with `peak_cpu_bytes`; chapter 4 (notebook 4.1) measures
what keeping the router in fp32 adds to the activations with `saved_tensor_bytes`, checked against
`retained_cpu_bytes`.

- CPU tensors have no `torch.cuda.max_memory_allocated`. The profiler with ``profile_memory=True`` records every
  allocation and free of the c10 CPU allocator together with the running total it reports. `peak_cpu_bytes` is the
  peak of that total, `retained_cpu_bytes` its value at the end, both minus what was allocated before the first
  event. They count tensor storage only (not Python objects or library scratch outside c10), and depend only on the
  sizes the computation allocates and frees, not on the machine's speed.
- `saved_tensor_bytes` counts the storages autograd keeps for backward (`torch.autograd.graph.saved_tensors_hooks`),
  each storage once, leaving out the ones you name (a model's parameters): the activation memory of a forward.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SavedTensors", "peak_cpu_bytes", "quiet_stderr", "retained_cpu_bytes", "saved_tensor_bytes"]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop log lines) for the duration."""
    try:
        fd = os.dup(2)
    except OSError:  # no usable stderr: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def _allocator_events(fn: Callable[[], Any], who: str) -> tuple[list[tuple[int, int, int]], Any]:
    """Run `fn()` under the memory profiler: (sorted (time, size, total) of every CPU allocation event, result)."""
    if not callable(fn):
        raise TypeError(f"{who}: fn must be callable, got {type(fn).__name__}")
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    events = []
    while stack:
        ev = stack.pop()
        stack.extend(ev.children)
        if ev.tag == _EventType.Allocation and ev.extra_fields.device.type == "cpu":
            events.append((ev.start_time_ns, ev.extra_fields.alloc_size, ev.extra_fields.total_allocated))
    events.sort()
    return events, result


def peak_cpu_bytes(fn: Callable[[], Any]) -> int:
    """Run ``fn()`` once and return the peak of CPU tensor bytes it held at once beyond what existed before.

    Allocations made inside ``fn`` and still alive at the end (results, ``.grad``) count; tensors that existed
    before the call do not.
    """
    events, _ = _allocator_events(fn, "peak_cpu_bytes")
    if not events:
        return 0
    before = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - before


def retained_cpu_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn()`` once; return (CPU tensor bytes still allocated when it returned, beyond what existed before, its
    result). Keep the result alive (it is returned) so that what it references, such as an autograd graph and the
    tensors saved for backward, stays counted."""
    events, result = _allocator_events(fn, "retained_cpu_bytes")
    if not events:
        return 0, result
    before = events[0][2] - events[0][1]
    return events[-1][2] - before, result


@dataclass
class SavedTensors:
    """What autograd saved during a forward: `nbytes` (each storage once) and one row per storage."""

    nbytes: int = 0
    rows: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)  # (dtype, shape, storage bytes)

    def by_dtype(self) -> dict[str, int]:
        """Saved bytes per dtype name ('float32', 'bfloat16', ...)."""
        out: dict[str, int] = {}
        for dtype, _, n in self.rows:
            out[dtype] = out.get(dtype, 0) + n
        return out


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[Any] = ()) -> tuple[SavedTensors, Any]:
    """Run ``fn()`` (a forward); return (the storages autograd saved for backward, ``fn``'s result).

    Each storage counts once however many ops save it (a view, a second use); storages of the tensors in
    ``exclude`` (a model's parameters: they are memory of the model, not of the activations) do not count.
    Keep the result alive until you have read the counts.
    """
    import torch

    if not callable(fn):
        raise TypeError(f"saved_tensor_bytes: fn must be callable, got {type(fn).__name__}")
    skip = set()
    for t in exclude:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"saved_tensor_bytes: exclude must hold tensors, got {type(t).__name__}")
        skip.add(t.untyped_storage().data_ptr())
    seen: dict[int, tuple[str, tuple[int, ...], int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in skip and key not in seen and storage.nbytes() > 0:
            seen[key] = (str(t.dtype).removeprefix("torch."), tuple(t.shape), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    rows = sorted(seen.values(), key=lambda r: (-r[2], r[0], r[1]))
    return SavedTensors(sum(r[2] for r in rows), rows), result
