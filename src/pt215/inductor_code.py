"""The code Inductor generates for a CUDA GPU this machine does not have (chapter 5, notebook 5).

`generated_code("module:function", capability=(10, 0), config={...})` imports `function`, which returns
`(fn, operands)`, and compiles `fn(*operands)` with Inductor for a simulated CUDA device of that compute
capability, in a child Python. It returns the wrapper code Inductor writes: the Python whose `call()` launches each
kernel in order. `launches(code)` lists those launches. `generate(...)` returns the code together with Inductor's
own count of the kernels it generated (`torch._inductor.metrics.generated_kernel_count`), a second reading of the
same compilation that does not parse the code.

What is simulated, and what is not. The operands are FakeTensors on `cuda`; torch's device queries
(`torch.cuda.get_device_capability`, `get_device_properties`, ...) and Triton's target are answered by the
simulation; and Inductor's joint-graph pattern setup (`torch._inductor.fx_passes.joint_graph.lazy_init`) is
skipped, because it traces its replacement patterns with real tensors on the device: the patterns it would
register are not applied (pad_mm's padding of `mm`/`bmm`/`addmm`, the SDPA fusion patterns, and two
`randperm` + `index_add` rewrites). None of them matches `_scaled_mm` or a pointwise multiply; a graph with plain
matmuls of unaligned shapes, or attention written out by hand, could compile differently on a real GPU. The
post-grad passes (where the output-scale fold lives), the lowerings and the scheduler run unchanged. The
generated kernels are never compiled or run, and an autotuning choice that needs a benchmark on the device cannot
be made: the code shows the choices Inductor makes without one.

The child process keeps the simulation (patched `torch.cuda` queries, a Triton driver that reports the simulated
target, Inductor caches) out of the caller's interpreter.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["generate", "generate_many", "generated_code", "launch_elements", "launches", "main"]

_LAUNCH = re.compile(r"^\s*(?:(extern_kernels\.\w+)\(|(\w+)\.run\()")


def _launch_lines(code: str) -> list[tuple[str, str]]:
    """`(kernel, line)` for every launch in the `call()` of Inductor's wrapper `code`, in order."""
    if not isinstance(code, str) or "def call(" not in code:
        raise ValueError("code must be Inductor's wrapper code (with a `def call(` function)")
    body = code[code.index("def call("):]
    out = []
    for line in body.splitlines()[1:]:
        if line and not line[0].isspace():
            break  # the end of call()
        m = _LAUNCH.match(line)
        if m:
            out.append((m.group(1) or m.group(2), line))
    return out


def launches(code: str) -> list[str]:
    """The kernel launches in the `call()` of Inductor's wrapper `code`, in order: `extern_kernels.<op>` for a
    library kernel (cuBLAS, ...), the kernel's name for a generated one (`triton_poi_fused_mul_0`, ...)."""
    return [name for name, _ in _launch_lines(code)]


_NUMEL = re.compile(r",\s*(\d+)\s*,\s*stream=")


def launch_elements(code: str) -> list[tuple[str, int | None]]:
    """`launches(code)` with the number of elements each generated kernel covers (the `xnumel` Inductor passes
    before `stream=`; `None` for a library call): a launch over 1 element computes a scalar."""
    out: list[tuple[str, int | None]] = []
    for name, line in _launch_lines(code):
        m = None if name.startswith("extern_kernels.") else _NUMEL.search(line)
        out.append((name, int(m.group(1)) if m else None))
    return out


def _builder(target: str) -> Callable[[], tuple[Callable[..., Any], Sequence[Any]]]:
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"target must be 'module:function' (e.g. 'pt215.nvfp4:decode_layer'), got {target!r}")
    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"target {target!r}: {module} has no function {name!r}")
    return fn


@contextlib.contextmanager
def _simulated_cuda(capability: tuple[int, int]) -> Iterator[None]:
    """torch's device queries and Triton's target answered as a CUDA GPU of `capability` would answer them."""
    import types
    from unittest import mock

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    props = types.SimpleNamespace(
        name=f"simulated sm_{capability[0]}{capability[1]}", major=capability[0], minor=capability[1],
        multi_processor_count=132, total_memory=80 * 2**30, warp_size=32, max_threads_per_block=1024,
        max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
        shared_memory_per_block_optin=232448, L2_cache_size=50 * 2**20, gcnArchName="")

    class _Driver:  # what Inductor asks Triton's active driver while generating code
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_interface(self) -> Any:
            return torch.cuda

        def is_active(self) -> bool:
            return True

    patches = {
        "torch.cuda.is_available": True, "torch.cuda.device_count": 1, "torch.cuda.current_device": 0,
        "torch.cuda.get_device_capability": capability, "torch.cuda.get_device_properties": props,
        "torch.cuda._exchange_device": 0, "torch.cuda._maybe_exchange_device": 0,
        "torch.cuda.get_rng_state": torch.zeros(16, dtype=torch.uint8),
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch(name, return_value=value))
        stack.enter_context(mock.patch("torch.cuda._get_device_properties", return_value=props, create=True))
        for name in ("torch.cuda.set_rng_state", "torch.cuda._lazy_init",
                     # the joint-graph passes trace their replacement patterns with real tensors on the device
                     "torch._inductor.fx_passes.joint_graph.lazy_init"):
            stack.enter_context(mock.patch(name))
        previous = driver._active  # restored as it was: reset_active() would start the real (absent) driver
        driver.set_active(_Driver())
        stack.callback(setattr, driver, "_active", previous)
        yield


def _generate(target: str, capability: tuple[int, int], config: Mapping[str, Any]) -> dict[str, Any]:
    """In this process: compile `target`'s function for the simulated GPU; the wrapper code and Inductor's own
    count of the kernels it generated."""
    from unittest import mock

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import codecache, metrics
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, operands = _builder(target)()
    captured: list[str] = []

    class _Written(Exception):  # noqa: N818 - raised to stop once the wrapper is written, before it is loaded
        pass

    def capture(key: str, path: str, *args: Any, **kwargs: Any) -> None:
        with open(path, encoding="utf-8") as f:
            captured.append(f.read())
        raise _Written

    with _simulated_cuda(capability), mock.patch.object(codecache.PyCodeCache, "load_by_key_path", capture):
        mode = FakeTensorMode()
        with mode:
            fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in operands]
        gm = make_fx(fn)(*fake)
        settings = {"compile_threads": 1, "force_disable_caches": True, **config}
        metrics.reset()
        with inductor_config.patch(settings), mode:
            try:
                compile_fx(gm, fake)
            except Exception as e:  # noqa: BLE001 - Inductor wraps the stop in its own error types
                if not captured:
                    raise RuntimeError(f"Inductor did not write wrapper code for {target}: {e}") from e
    return {"code": captured[0], "generated_kernels": metrics.generated_kernel_count}


def generated_code(target: str, *, capability: tuple[int, int] = (10, 0), config: Mapping[str, Any] | None = None,
                   timeout: float = 600.0) -> str:
    """Inductor's wrapper code for `target` ("module:function" returning `(fn, operands)`) compiled for a
    simulated CUDA GPU of `capability` with the Inductor `config` entries, generated in a child Python."""
    return generate(target, capability=capability, config=config, timeout=timeout)["code"]


def generate(target: str, *, capability: tuple[int, int] = (10, 0), config: Mapping[str, Any] | None = None,
             timeout: float = 600.0) -> dict[str, Any]:
    """`{"code", "generated_kernels"}`: `generated_code`'s wrapper code, and the number of kernels Inductor's
    code generators created for it (`torch._inductor.metrics.generated_kernel_count`: Triton and other generated
    kernels; library calls such as `extern_kernels._scaled_mm` are not generated and not counted). Kernels with
    the same source are defined once and launched as often as needed; each generated kernel is one launch."""
    return generate_many([{"target": target, "capability": capability, "config": config}], timeout=timeout)[0]


def generate_many(jobs: Sequence[Mapping[str, Any]], *, timeout: float = 600.0) -> list[dict[str, Any]]:
    """`generate` for several compilations in one child Python (one import of torch and Inductor for all):
    each job a mapping with `target` and optionally `capability` and `config`; the results in the same order."""
    if not jobs:
        raise ValueError("jobs must name at least one compilation")
    requests = []
    for job in jobs:
        target, capability = job.get("target"), tuple(job.get("capability", (10, 0)))
        _builder(target)  # a bad target fails here, with its name
        if len(capability) != 2 or not all(isinstance(v, int) and v >= 0 for v in capability):
            raise ValueError(f"capability must be (major, minor), e.g. (10, 0), got {job.get('capability')!r}")
        requests.append({"target": target, "capability": list(capability), "config": dict(job.get("config") or {})})
    proc = subprocess.run([sys.executable, "-m", "pt215.inductor_code"], input=json.dumps(requests),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"generating code for {[r['target'] for r in requests]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Child side of `generate_many`: a JSON list of requests on stdin, a list of `{"code", "generated_kernels"}`
    on stdout."""
    import logging

    logging.disable(logging.WARNING)  # Inductor logs the deliberate stop as an error
    requests = json.loads(sys.stdin.read())
    sys.stdout.write(json.dumps([_generate(r["target"], tuple(r["capability"]), r["config"]) for r in requests]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
