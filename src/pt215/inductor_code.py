"""The code Inductor generates for a CUDA GPU this machine does not have (chapter 5, notebook 5).

`generated_code("module:function", capability=(10, 0), config={...})` imports `function`, which returns
`(fn, operands)`, and compiles `fn(*operands)` with Inductor for a simulated CUDA device of that compute
capability, in a child Python. It returns the wrapper code Inductor writes: the Python whose `call()` launches each
kernel in order. `launches(code)` lists those launches. The operands are FakeTensors on `cuda`, the Triton target
is set by hand and torch's device queries are answered by the simulation; Inductor's own passes, lowerings and
scheduler run unchanged. The generated kernels are never compiled or run, and an autotuning choice that needs a
benchmark on the device cannot be made: the code shows the choices Inductor makes without one.

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

__all__ = ["generated_code", "launches", "main"]

_LAUNCH = re.compile(r"^\s*(?:(extern_kernels\.\w+)\(|(\w+)\.run\()")


def launches(code: str) -> list[str]:
    """The kernel launches in the `call()` of Inductor's wrapper `code`, in order: `extern_kernels.<op>` for a
    library kernel (cuBLAS, ...), the kernel's name for a generated one (`triton_poi_fused_mul_0`, ...)."""
    if not isinstance(code, str) or "def call(" not in code:
        raise ValueError("code must be Inductor's wrapper code (with a `def call(` function)")
    body = code[code.index("def call("):]
    out = []
    for line in body.splitlines()[1:]:
        if line and not line[0].isspace():
            break  # the end of call()
        m = _LAUNCH.match(line)
        if m:
            out.append(m.group(1) or m.group(2))
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


def _generate(target: str, capability: tuple[int, int], config: Mapping[str, Any]) -> str:
    """In this process: compile `target`'s function for the simulated GPU and return the wrapper code."""
    from unittest import mock

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import codecache
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
        with inductor_config.patch(settings), mode:
            try:
                compile_fx(gm, fake)
            except Exception as e:  # noqa: BLE001 - Inductor wraps the stop in its own error types
                if not captured:
                    raise RuntimeError(f"Inductor did not write wrapper code for {target}: {e}") from e
    return captured[0]


def generated_code(target: str, *, capability: tuple[int, int] = (10, 0), config: Mapping[str, Any] | None = None,
                   timeout: float = 600.0) -> str:
    """Inductor's wrapper code for `target` ("module:function" returning `(fn, operands)`) compiled for a
    simulated CUDA GPU of `capability` with the Inductor `config` entries, generated in a child Python."""
    _builder(target)  # a bad target fails here, with its name
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(v, int) and v >= 0 for v in capability)):
        raise ValueError(f"capability must be (major, minor), e.g. (10, 0), got {capability!r}")
    request = json.dumps({"target": target, "capability": list(capability), "config": dict(config or {})})
    proc = subprocess.run([sys.executable, "-m", "pt215.inductor_code"], input=request, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"generating code for {target} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["code"]


def main(argv: Sequence[str] | None = None) -> int:
    """Child side of `generated_code`: a JSON request on stdin, `{"code": ...}` on stdout."""
    import logging

    logging.disable(logging.WARNING)  # Inductor logs the deliberate stop as an error
    req = json.loads(sys.stdin.read())
    code = _generate(req["target"], tuple(req["capability"]), req["config"])
    sys.stdout.write(json.dumps({"code": code}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
