"""The book's one clock: device sync, a stopwatch, and the timing loops every benchmark uses.

`time.perf_counter` appears in this module only. Chapters 1-6 time through it: `bench.time_collective`
(chapter 1's back-to-back loop), `roofline.copy_bandwidth` and `roofline.measure_decode` (chapters 1, 3, 5, 6),
and the interleaved comparisons of chapters 5 and 6. Timings are never validated outputs: notebooks print
them in cells tagged `nbval-ignore-output`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["Stopwatch", "interleaved_medians", "interleaved_samples", "median_seconds", "sync", "thread_cpu_samples",
           "time_samples"]

Device = torch.device | str | None


def sync(device: Device = None) -> None:
    """Wait until the work queued on `device` has finished (`torch.accelerator.synchronize`).

    CPU work is synchronous, so `None` and `"cpu"` return at once; `"cuda"`, `"cuda:1"`, `"mps"` and other
    accelerators wait for their queue. Call it before starting and before stopping a clock around device work.
    """
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be a torch.device, a device string or None, got {device!r}") from e
    if dev.type != "cpu":
        torch.accelerator.synchronize(dev)


class Stopwatch:
    """Elapsed wall time in seconds, with `device` synchronized when it starts and when it is read.

        with Stopwatch("cuda") as sw:      # frozen at the end of the block
            step()
        sw.seconds

        sw = Stopwatch()                   # or running: each read gives the time so far
        ...; print(f"{sw.seconds:.0f} s")
    """

    def __init__(self, device: Device = None) -> None:
        self.device = device
        sync(device)
        self._start = time.perf_counter()
        self._stop: float | None = None

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start, self._stop = time.perf_counter(), None
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.device)
        self._stop = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Seconds since the start: up to the end of the `with` block, or up to now while running."""
        if self._stop is not None:
            return self._stop - self._start
        sync(self.device)
        return time.perf_counter() - self._start


def _check_counts(iters: Any, warmup: Any, calls: Any = 1) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")


def _timed(fn: Callable[[], Any], device: Device, calls: int = 1) -> float:
    """Seconds per call of `calls` back-to-back calls of `fn()` between two device syncs."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / calls


def time_samples(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2, device: Device = None,
                 calls: int = 1) -> list[float]:
    """`iters` samples of the wall time of one call of `fn()` in seconds, after `warmup` untimed calls.

    `device` is synchronized before the clock starts and before it stops (`sync`), so asynchronous device
    work is inside each sample. With `calls > 1` a sample is `calls` back-to-back calls between the two syncs,
    divided by `calls`: for a small op (tens of microseconds) a sync per call would add its own fixed cost to
    every call and push the ratios between variants towards 1.
    """
    _check_counts(iters, warmup, calls)
    sync(device)
    for _ in range(warmup):
        fn()
    return [_timed(fn, device, calls) for _ in range(iters)]


def interleaved_samples(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        device: Device = None, calls: int = 1) -> dict[str, list[float]]:
    """`time_samples` for several variants at once, round-robin: `warmup` untimed rounds, then `iters` timed
    rounds, each timing every function once in the order given (`calls` back-to-back calls per sample).

    A slower or busier moment of the machine then falls on all variants alike instead of on whichever was
    measured last, so the variants' medians can be compared with each other.
    """
    if not isinstance(fns, Mapping) or not fns or not all(callable(f) for f in fns.values()):
        raise ValueError(f"fns must be a non-empty mapping of names to callables, got {fns!r}")
    _check_counts(iters, warmup, calls)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            times[name].append(_timed(fn, device, calls))
    return times


def interleaved_medians(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        device: Device = None, calls: int = 1) -> dict[str, float]:
    """Median seconds per call of each variant from `interleaved_samples(...)`."""
    return {name: statistics.median(t) for name, t in
            interleaved_samples(fns, iters=iters, warmup=warmup, device=device, calls=calls).items()}


def median_seconds(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2, device: Device = None,
                   calls: int = 1) -> float:
    """Median of `time_samples(...)`, in seconds per call."""
    return statistics.median(time_samples(fn, iters=iters, warmup=warmup, device=device, calls=calls))


def thread_cpu_samples(fn: Callable[[], Any], *, iters: int = 10, calls: int = 1) -> list[float]:
    """CPU seconds this thread spends per call of `fn()` (`time.thread_time`): `iters` samples of `calls` calls.

    Not a wall clock: time the thread waits (a peer, a lock, the other core being busy) is not in it, so it
    isolates the work the calling thread itself does per call (chapter 2's recorder cost on a loaded machine).
    """
    _check_counts(iters, 0, calls)
    out = []
    for _ in range(iters):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        out.append((time.thread_time() - t0) / calls)
    return out
