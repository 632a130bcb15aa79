"""`python -m pt215.verify`: run every hardware-gated path of the book that this machine supports (chapters 0-6).

    python -m pt215.verify --list                  # every gated path: id, chapter, needs
    python -m pt215.verify                         # run what this machine supports, skip the rest, print a table
    python -m pt215.verify --out run.json          # ... and write the JSON record (data/hardware-runs/README.md)
    python -m pt215.verify --only ch1.             # only the paths whose id contains "ch1."
    python -m pt215.verify --only boundary         # only the run to the hardware boundary (below)

Each path runs the code its notebook cell or chapter script runs (the script itself through `pt215.launch.run`,
or the `pt215` function the cell calls) and asserts on the results. A path whose needs (`pt215.hardware`
vocabulary) the machine does not meet is skipped with the reason. Paths marked fake CUDA run everywhere: the
CUDA calls on FakeTensors (`pt215.fake_cuda`), shapes and dtypes checked, no kernel run. Exit code 1 if any
check failed.

Then, on any machine, the run to the boundary (`pt215.boundary`): every command a notebook cell launches
(`pt215.launch.run("X.py", args=[...])`, read from the notebooks' code cells) runs as rank 0 on CPU through
the script's argument checks and set-up, up to its first hardware call; a command that fails before it makes
the exit code 1. `--skip-boundary` leaves it out; `--only` runs it only for `--only boundary`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pt215 import fake_cuda, hardware
from pt215.hardware import HardwareReport
from pt215.timing import Stopwatch

__all__ = ["PATHS", "GatedPath", "Outcome", "machine_record", "main", "run_paths"]

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
SCHEMA = 1


@dataclass
class Outcome:
    """What a passed check measured (`figures`) and, where one applies, the limit it was compared with."""

    figures: dict[str, Any] = field(default_factory=dict)
    limit: str | None = None


@dataclass(frozen=True)
class GatedPath:
    """One hardware-gated path of the book: where it is, what it needs, and the check that runs it."""

    id: str
    chapter: int
    title: str
    where: str                      # the page or script, relative to the repository root
    needs: tuple[str, ...]          # pt215.hardware needs; () = runs everywhere (fake CUDA)
    check: Callable[[], Outcome]
    fake: bool = False              # True: FakeTensor CUDA, no kernel runs


# ----------------------------------------------------------------------------------------------- helpers


def _chapter(name: str) -> Path:
    folder = CHAPTERS / name
    if not folder.is_dir():
        raise FileNotFoundError(f"chapter folder {name!r} not found next to the pt215 sources (run from a "
                                "checkout of the book)")
    return folder


def _launch(chapter: str, script: str, nproc: int, args: Sequence[str] = (), timeout: float = 180,
            env: dict[str, str] | None = None):
    from pt215.launch import run

    return run(script, nproc=nproc, args=list(args), timeout=timeout, env=env, cwd=_chapter(chapter),
               stream=False, show=False)


def _ngpu(cap: int | None = None) -> int:
    n = torch.cuda.device_count()
    return n if cap is None else min(cap, n)


_SHARED: dict[str, Any] = {}


def _once(key: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` once per verify run (several paths check one launch of the same script)."""
    if key not in _SHARED:
        _SHARED[key] = fn()
    return _SHARED[key]


def _no_error(text: str, what: str) -> None:
    assert not text.split(":")[0].endswith(("Error", "Exception")), f"{what}: {text}"


# --------------------------------------------------------------------------------------- chapter 0 and 1


def ch0_gpus() -> Outcome:
    hw = hardware.report()
    assert hw.cuda_devices and all(d.memory_gib > 0 for d in hw.cuda_devices)
    return Outcome({"gpus": [f"{d.name} ({d.sm})" for d in hw.cuda_devices]})


def ch1_collectives() -> Outcome:
    n = _ngpu(4)
    nccl = _launch("01-collectives-nccl2", "collectives.py", n, ["--backend", "nccl"]).results
    gloo = _launch("01-collectives-nccl2", "collectives.py", n, ["--backend", "gloo"]).results
    names = [k for k in gloo[0]["ops"] if k != "reduce"]
    differ = [k for k in names if any(nccl[r]["ops"][k] != gloo[r]["ops"][k] for r in range(n))]
    assert not differ, f"nccl and gloo disagree on {differ}"
    return Outcome({"ranks": n, "collectives compared with gloo": len(names)})


def ch1_eager_init() -> Outcome:
    n = _ngpu()
    rows = {}
    for backend, lazy in (("nccl-legacy", True), ("nccl-legacy", False), ("nccl", False)):
        args = ["--backend", backend, *(["--lazy"] if lazy else [])]
        r = _launch("01-collectives-nccl2", "eager_init.py", n, args).results[0]
        assert r["sum"] == n, r
        rows[f"{backend} {'lazy' if lazy else 'eager'}"] = {k: round(r[k], 3) for k in ("init_ms", "first_ms")}
    return Outcome(rows)


def _nccl_only() -> dict:
    res = _launch("01-collectives-nccl2", "nccl_only.py", _ngpu(), ["--backend", "nccl"]).results
    return res[0]


def ch1_time_estimator() -> Outcome:
    r = _once("nccl_only", _nccl_only)
    _no_error(r["_time_estimator"], "_time_estimator")
    assert "tensor untouched: True" in r["_time_estimator"], r["_time_estimator"]
    return Outcome({"_time_estimator": r["_time_estimator"], "backend class": r["backend class"]})


def ch1_tensor_alloc() -> Outcome:
    r = _once("nccl_only", _nccl_only)
    for key in ("allocate_tensor", "mem_allocator + pool"):
        _no_error(r[key], key)
    n = _ngpu()
    assert r["allocate_tensor"].endswith(f"-> {n * (n + 1) // 2}"), r["allocate_tensor"]
    return Outcome({k: r[k] for k in ("supports_tensor_alloc", "allocate_tensor", "mem_allocator + pool")})


def ch1_shrink_group() -> Outcome:
    r = _once("nccl_only", _nccl_only)
    _no_error(r["shrink_group"], "shrink_group")
    n = _ngpu()
    assert r["shrink_group"].startswith(f"new size {n - 1}"), r["shrink_group"]
    return Outcome({"shrink_group": r["shrink_group"]})


def ch1_busbw() -> Outcome:
    n = _ngpu()
    figures, limit = {}, None
    for backend in ("nccl", "nccl-legacy"):
        o = _launch("01-collectives-nccl2", "bandwidth.py", n, ["--backend", backend, "-b", "1M", "-e", "256M",
                                                                "--copy-bytes", "1G", "--rounds", "2"],
                    timeout=300).results[0]
        big = o["rows"][-1]
        assert big["busbw"] > 0
        link = o["link"]
        figures[backend] = {"busbw_GBps at 256 MiB": round(big["busbw"], 1), "link": link}
        if link and link["GBps"]:
            assert big["busbw"] <= 1.05 * link["GBps"], f"busbw {big['busbw']:.0f} above the link peak {link}"
            limit = f"{link['kind']}: {link['GBps']:g} GB/s per direction ({link['how']})"
    return Outcome(figures, limit)


def ch1_window_put() -> Outcome:
    """1.4's GPU cell: a put + signal through an NCCL2 window (`window_put.py`, 2 ranks)."""
    res = _launch("01-collectives-nccl2", "window_put.py", 2, timeout=180).results
    assert res[1].get("received_ok") is True, res
    return Outcome({"nccl": res[0]["nccl"], "supports_window": res[0]["supports_window"], "received_ok": True})


def ch1_time_estimate() -> Outcome:
    """1.4's GPU cell: `_time_estimator` vs CUDA-event time of the same all_reduce (`time_estimate.py`)."""
    r = _launch("01-collectives-nccl2", "time_estimate.py", _ngpu(), timeout=300).results[0]
    sizes = {k: v for k, v in r.items() if k != "nccl"}
    assert sizes and all(v["estimated_us"] > 0 and v["measured_us"] > 0 for v in sizes.values()), r
    return Outcome({f"{int(k) >> 10} KiB": {"estimated_us": round(v["estimated_us"], 1),
                                           "measured_us": round(v["measured_us"], 1)} for k, v in sizes.items()})


# ------------------------------------------------------------------------------------------- chapter 2


def _hang_nccl(extra: Sequence[str], env: dict[str, str] | None) -> Outcome:
    from pt215 import flight
    from pt215.launch import LaunchError

    with tempfile.TemporaryDirectory() as tmp:
        try:
            _launch("02-flight-recorder", "hang_lab.py", 2, ["--case", "skip", "--backend", "nccl", "--timeout",
                                                             "10", "--dump-dir", tmp, *extra], timeout=120, env=env)
        except LaunchError as e:  # NCCL may abort a rank after the dump; the dumps are what is checked
            print(f"  (launch ended with {type(e).__name__})")
        files = sorted(p.name for p in Path(tmp).iterdir() if p.is_file() and p.name.startswith("rank_"))
        assert files == ["rank_0", "rank_1"], f"dump files: {files}"
        diag = flight.diagnose(tmp, allow_incomplete=True)
        assert not diag.healthy, diag.summary()
        return Outcome({"dump files": files, "verdict": diag.verdict()})


def ch2_fr_autodump() -> Outcome:
    return _hang_nccl([], {"TORCH_FR_DUMP_ON_TIMEOUT": "1"})


def ch2_fr_py_watchdog() -> Outcome:
    return _hang_nccl(["--py-watchdog"], None)


def ch2_fr_legacy_py_watchdog() -> Outcome:
    """`--py-watchdog` on the legacy ProcessGroupNCCL: the dumps come from `_dump_nccl_trace()`, not a ring."""
    return _hang_nccl(["--py-watchdog"], {"TORCH_DIST_USE_NCCL2": "0"})


def ch2_debug_server_nccl2() -> Outcome:
    """2.5's GPU cell: NCCL2 marks itself unhealthy; the frontend's health round collects every rank's dump."""
    from pt215.launch import LaunchError

    n = _ngpu()
    with tempfile.TemporaryDirectory() as tmp:
        outcomes: dict[int, str] = {}
        try:
            res = _launch("02-flight-recorder", "debug_server.py", n, ["--dump-dir", tmp, "--backend", "nccl",
                                                                      "--timeout", "10", "--stuck", "30"],
                          timeout=180, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"})
            outcomes = {r: v["outcome"] for r, v in res.results.items()}
        except LaunchError as e:
            print(f"  (launch ended with {type(e).__name__})")
        files = sorted(p.name for p in Path(tmp).glob("rank_*"))
        health = " ".join(p.read_text(errors="replace") for p in (Path(tmp) / "periodic").glob("c10d_health_check_*"))
        assert files == [f"rank_{r}" for r in range(n)], f"dump files: {files}"
        assert "Unhealthy rank detected" in health, "no periodic health round saw the unhealthy backend"
        assert all(o != "completed" for r, o in outcomes.items() if r != n - 1), outcomes
        return Outcome({"dump files": files, "outcomes": outcomes})


# ------------------------------------------------------------------------------------------- chapter 3


def ch3_api_tour() -> Outcome:
    res = _launch("03-nixl-transfers", "api_tour.py", 2, ["--store", "tcp"], timeout=150).results
    r0, r1 = res[0], res[1]
    assert r1["inbox"] == [8.0, 9.0, 10.0, 11.0] + [float(i) for i in range(4, 16)]
    assert r0["gathered"] == [-(200.0 + i) for i in range(16)]
    return Outcome({"ranks": 2, "inbox": len(r1["inbox"])})


def ch3_kv_migrate() -> Outcome:
    res = _launch("03-nixl-transfers", "kv_migrate.py", 2, ["--layers", "8", "--heads", "8", "--head-dim", "32",
                                                            "--seq", "512"], timeout=150).results
    dec = next(r for r in res.values() if "bit_exact" in r)
    assert dec["bit_exact"] and dec["same_output"] and dec["mib"] == 8, dec
    return Outcome({"MiB": dec["mib"], "bit_exact": dec["bit_exact"]})


def ch3_cuda_stream_write() -> Outcome:
    """The 3.1 GPU cell: a CUDA-to-CUDA NIXL write ordered on a side stream, then replayed from a CUDA graph."""
    from torch.distributed._transport import new_transport

    a, b = new_transport("nixl", "cuda"), new_transport("nixl", "cuda")
    a.connect(b.bind())
    b.connect(a.bind())
    src = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    dst = torch.zeros_like(src)
    src_mem, dst_mem = a.register_memory(src), b.register_memory(dst)
    remote = dst_mem.to_remote_buffer()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())  # src and dst were made on the default stream
        with torch.cuda.stream(stream):
            src.mul_(2)
            a.write_stream(src_mem.to_view(), remote, timeout=30)
            total = dst.sum()
        stream.synchronize()
        assert torch.equal(dst, src) and total.item() == src.sum().item()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            src.add_(1)
            a.write_stream(src_mem.to_view(), remote, timeout=30)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst, src) and dst[0].item() == 3.0
        return Outcome({"MiB": 4, "graph replays": 3})
    finally:
        torch.cuda.synchronize()
        a.close(timeout=30)
        b.close(timeout=30)


# ------------------------------------------------------------------------------------------- chapter 4


def ch4_fsdp_override() -> Outcome:
    res = _launch("04-fsdp2-precision", "fsdp_override.py", 2, ["--backend", "nccl"], timeout=150).results
    assert sorted(res) == [0, 1]
    return Outcome({"ranks": 2})


def ch4_fsdp_cuda_graph() -> Outcome:
    r = _launch("04-fsdp2-precision", "fsdp_cuda_graph.py", 2, ["--micro", "4", "--windows", "2"],
                timeout=300).results[0]
    assert r["graphed"] and len(r["windows"]) == 2, r
    for w in r["windows"]:
        assert all(c == 1 for c in w["reduce_scatter"].values()), w["reduce_scatter"]
        assert w["same_storage"] and w["rel_diff"] < 1e-3, w
    return Outcome({"rel_diff": [w["rel_diff"] for w in r["windows"]]},
                   "relative difference to plain FSDP2 accumulation < 1e-3")


def ch4_fsdp_graph_whole_step() -> Outcome:
    """The experiment: one whole FSDP2 microbatch captured in a CUDA graph. Passes when the script ran; the
    record holds what happened (captured and replayed, with the gradient difference, or the error)."""
    r = _launch("04-fsdp2-precision", "fsdp_cuda_graph.py", 2, ["--whole-step"], timeout=300).results[0]
    return Outcome({"whole FSDP2 microbatch in a CUDA graph": r["whole_step"]})


def _graph_twin(device: str):
    """The hook-free twin of fsdp_cuda_graph.py with FSDP2's unsharded dtypes (router + norms fp32, rest bf16)."""
    from pt215.fsdp import MoEConfig, MoETransformer, keep_fp32_override

    with torch.device("meta"):
        twin = MoETransformer(MoEConfig(dispatch="dense"))
    _, kept = keep_fp32_override(twin)
    for name, p in list(twin.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        dtype = torch.float32 if name in kept else torch.bfloat16
        setattr(twin.get_submodule(owner) if owner else twin, leaf,
                torch.nn.Parameter(torch.empty(p.shape, dtype=dtype, device=device)))
    return twin


def ch4_fake_graph_step() -> dict:
    """The captured step of fsdp_cuda_graph.py: its forward on fake CUDA (the CUDA meta checks, and no read
    of a device value, which a capture forbids); sparse dispatch refused for the same reason; the whole step
    (forward, `autograd.grad`, `_foreach_add_` into fp32 buffers) on the meta device, where autograd runs
    without a GPU (on fake CUDA its engine asks for a CUDA context)."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    from pt215.fsdp import local_grad_step

    out: dict = {}
    with fake_cuda.simulated_gpu((9, 0)):
        twin = _graph_twin("cuda")
        tokens = torch.zeros(2, 16, dtype=torch.int64, device="cuda")
        loss, ce = twin.loss(tokens, tokens)
        assert loss.device.type == "cuda" and loss.shape == () and loss.dtype == torch.float32
        out["forward (fake cuda)"] = f"loss {list(loss.shape)} {str(loss.dtype).removeprefix('torch.')}"
        for blk in twin.blocks:
            blk.moe.experts.dispatch = "sparse"
        try:
            twin.loss(tokens, tokens)
            raise AssertionError("sparse dispatch ran on fake CUDA without reading a device value")
        except DynamicOutputShapeException as e:
            out["sparse dispatch"] = f"{type(e).__name__}: {e}"
    twin = _graph_twin("meta")
    params = list(twin.parameters())
    bufs = [torch.zeros(p.shape, dtype=torch.float32, device="meta") for p in params]
    tokens = torch.zeros(2, 16, dtype=torch.int64, device="meta")
    local_grad_step(twin, params, bufs, tokens, tokens, 0.25)()
    assert all(b.dtype == torch.float32 and b.shape == p.shape for b, p in zip(bufs, params, strict=True))
    out["step (meta)"] = f"{len(bufs)} fp32 gradient buffers, one per parameter"
    twin.cfg = type(twin.cfg)(dispatch="sparse")
    out["sparse refused"] = fake_cuda.expect_error(
        lambda: local_grad_step(twin, params, bufs, tokens, tokens, 0.25), "dispatch='dense'")
    return out


# ------------------------------------------------------------------------------------------- chapter 5


def _nvfp4_operands():
    from pt215 import nvfp4

    g = torch.Generator().manual_seed(0)
    qa = nvfp4.quantize(torch.randn(16, 512, generator=g))
    qw = nvfp4.quantize(torch.randn(256, 512, generator=g) * 0.02)
    return nvfp4.mm_operands(qa, qw), qa.dequantize() @ qw.dequantize().T


def ch5_nvfp4() -> Outcome:
    from pt215 import nvfp4

    args, ref = _nvfp4_operands()
    out = nvfp4.scaled_mm(*[t.cuda() for t in args]).float().cpu()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
    return Outcome({"relative error": err}, "relative error < 2e-2 (bf16 output)")


def ch5_nvgemm() -> Outcome:
    """Compile the NVFP4 GEMM with NVGEMM allowed, in its two forms, and report which kernels ran (the
    profiler): the two-level ``F.scaled_mm`` (Inductor's ``tuned_scaled_mm_v2`` hands it to the eager op) and
    ``torch._scaled_mm(...) * (ga * gb)`` (``nvfp4.scaled_mm_foldable``, the multiply folded into the GEMM)."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import ensure_nv_universal_gemm_available
    from torch.profiler import ProfilerActivity, profile

    from pt215 import nvfp4

    args, ref = _nvfp4_operands()
    cuda_args = [t.cuda() for t in args]
    if not ensure_nv_universal_gemm_available():
        raise _Skip("nvidia-cutlass-operators / nvidia-cutlass-dsl not installed: Inductor cannot consider NVGEMM")
    figures: dict[str, object] = {}
    for form, fn in (("F.scaled_mm two-level", nvfp4.scaled_mm), ("_scaled_mm * scale", nvfp4.scaled_mm_foldable)):
        torch._dynamo.reset()
        counters["inductor"]["scaled_mm_output_scale_fused"] = 0
        with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON,NVGEMM"):
            compiled = torch.compile(fn)
            out = compiled(*cuda_args)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = compiled(*cuda_args)
                torch.cuda.synchronize()
        kernels = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
        err = ((out.float().cpu() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (form, err)
        figures[form] = {"relative error": err, "CUDA kernels": kernels,
                         "scale multiplies folded": counters["inductor"]["scaled_mm_output_scale_fused"],
                         "NVGEMM/CUTLASS kernel ran": any("cutlass" in k.lower() or "nvgemm" in k.lower()
                                                          for k in kernels)}
    return Outcome(figures, "relative error < 2e-2 for both forms; the kernels are reported, not assumed")


def ch5_fake_scale_fold() -> dict:
    """Inductor's post-grad fold of ``_scaled_mm(...) * scale`` on fake CUDA tensors: it fires for the
    foldable NVFP4 form under max-autotune with NVGEMM, and not for the two-level ``F.scaled_mm`` or without
    NVGEMM (``nvfp4.post_grad_scale_fold``)."""
    from pt215 import nvfp4

    args, _ = _nvfp4_operands()
    fold = nvfp4.post_grad_scale_fold(nvfp4.scaled_mm_foldable, args)
    assert fold["folded"] == 1 and fold["scale_result"], fold
    two_level = nvfp4.post_grad_scale_fold(nvfp4.scaled_mm, args)
    assert two_level["folded"] == 0 and "_scaled_mm_v2.default" in two_level["after"], two_level
    no_nvgemm = nvfp4.post_grad_scale_fold(nvfp4.scaled_mm_foldable, args, backends="ATEN,TRITON")
    assert no_nvgemm["folded"] == 0, no_nvgemm
    torchao_form = nvfp4.post_grad_scale_fold(_torchao_nvfp4_mm, args)
    assert torchao_form["folded"] == 0, torchao_form
    return {"foldable form": fold["after"], "two-level F.scaled_mm": two_level["after"],
            "without NVGEMM": no_nvgemm["after"], "torchao 0.18 form (bf16 0-D scale)": torchao_form["after"]}


def _torchao_nvfp4_mm(A, B, sa, sb, ga, gb):  # noqa: ANN001, ANN202, N803 - the operands of nvfp4.scaled_mm
    """torchao 0.18's NVFP4 mm (`_addmm_nvfp4_dispatch`): `_scaled_mm(...)` in the input dtype, then
    `result * scale_result.to(a.orig_dtype)`, a 0-D **bf16** scale for a bf16 model, which the fold's check
    (a 0-D fp32 CUDA scale) rejects."""
    return torch._scaled_mm(A, B.t(), sa, sb, out_dtype=torch.bfloat16) * (ga * gb).to(torch.bfloat16)


def ch5_paged_attention() -> Outcome:
    """The 5.4 GPU cell: causal paged GQA decode through varlen_attn vs the CPU reference; which backend ran."""
    from torch.nn.attention.varlen import varlen_attn

    from pt215.attention import PagePool, paged_attention_reference

    torch.manual_seed(0)
    pool = PagePool(num_pages=8, page_size=256, n_kv_heads=2, head_dim=64, dtype=torch.bfloat16)
    ids = [pool.add_sequence() for _ in range(3)]
    for s, n in zip(ids, (300, 700, 90), strict=True):
        pool.append(s, torch.randn(n, 2, 64).bfloat16(), torch.randn(n, 2, 64).bfloat16())
    bt, su = pool.block_table(ids), pool.seqused_k(ids)
    cu = torch.arange(4, dtype=torch.int32)
    q = torch.randn(3, 8, 64).bfloat16()
    ref = paged_attention_reference(q, pool.k, pool.v, cu, bt, su, window_size=(-1, 0)).float()
    with profile_kernels() as kernels:
        real = varlen_attn(q.cuda(), pool.k.cuda(), pool.v.cuda(), cu.cuda(), None, 1, int(su.max()),
                           window_size=(-1, 0), enable_gqa=True, seqused_k=su.cuda(), block_table=bt.cuda())
        torch.cuda.synchronize()
    err = (real.float().cpu() - ref).abs().max().item()
    assert err < 3e-2, err
    return Outcome({"max abs error": err, "CUDA kernels": kernels}, "max abs error < 3e-2 (bf16)")


class profile_kernels:  # noqa: N801 - used as a context manager
    """Collect the names of the CUDA kernels run inside the block (a list filled on exit)."""

    def __enter__(self) -> list[str]:
        from torch.profiler import ProfilerActivity, profile

        self.names: list[str] = []
        self.prof = profile(activities=[ProfilerActivity.CUDA])
        self.prof.__enter__()
        return self.names

    def __exit__(self, *exc: object) -> None:
        self.prof.__exit__(*exc)
        self.names.extend(sorted({e.key for e in self.prof.key_averages() if e.device_type.name == "CUDA"}))


# ------------------------------------------------------------------------------------------- chapter 6


def _fp8_vs_cpu(device: str) -> Outcome:
    from pt215 import fp8

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g) * 0.05
    figures = {}
    for sc in ("tensorwise", "rowwise"):
        q = fp8.quantize(w, scaling=sc)
        qd = fp8.FP8Tensor(q.data.to(device), q.scale.to(device), sc)
        for m in (1, 4, 64):
            y_dev = fp8.scaled_matmul(x[:m].to(device), qd, out_dtype=torch.float32).cpu()
            y_cpu = fp8.scaled_matmul(x[:m], q, out_dtype=torch.float32)
            err = fp8.rel_error(y_cpu, y_dev)
            assert err < 2e-2, (sc, m, err)
            figures[f"{sc} M={m}"] = err
    return Outcome(figures, f"relative difference to the CPU reference < 2e-2 ({device})")


def ch6_fp8_cuda() -> Outcome:
    return _fp8_vs_cpu("cuda")


def ch6_fp8_mps() -> Outcome:
    out = _fp8_vs_cpu("mps")
    e5 = torch.zeros(16, 16).to(torch.float8_e5m2)
    try:
        e5.to("mps")
        out.figures["e5m2 tensor on MPS"] = "created"
    except (RuntimeError, TypeError) as e:
        out.figures["e5m2 tensor on MPS"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out


def ch6_moe_mps() -> Outcome:
    from pt215 import fp8, moe

    layer = moe.SeededMoE(256, 512, 8, 2, seed=0)
    layer.to_fp8()
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = layer(x, "loop").float()
    layer_mps = moe.SeededMoE(256, 512, 8, 2, seed=0).to("mps")
    layer_mps.to_fp8()
    figures = {}
    for impl in ("grouped", "loop", "fp8"):
        y = layer_mps(x.to("mps"), impl).float().cpu()
        figures[impl] = fp8.rel_error(ref, y)
        assert figures[impl] < (5e-2 if impl == "fp8" else 2e-2), (impl, figures[impl])
    return Outcome(figures, "relative difference to the CPU bf16 loop < 2e-2 (bf16), < 5e-2 (FP8)")


def ch6_mps_streams() -> Outcome:
    a = torch.randn(256, 256, device="mps")
    s1, s2 = torch.mps.Stream(), torch.mps.Stream()
    with torch.mps.stream(s1):
        r1 = torch.tanh(a @ a)
    with torch.mps.stream(s2):
        r2 = torch.tanh(a @ a)
    torch.mps.synchronize()
    assert torch.allclose(r1, r2)
    return Outcome({"streams": 2})


def ch6_mps_record_stream() -> Outcome:
    """6.3's first GPU cell: a tensor used on a side MPS stream, kept alive by `record_stream`."""
    side = torch.mps.Stream()
    x = torch.randn(2048, 2048, device="mps")
    torch.mps.synchronize()
    with torch.mps.stream(side):
        y = x @ x
    x.record_stream(side)
    del x
    z = torch.randn(2048, 2048, device="mps")
    side.synchronize()
    assert bool(torch.isfinite(y).all()) and tuple(z.shape) == (2048, 2048)
    return Outcome({"side-stream result finite": True})


def ch6_mps_kernels() -> Outcome:
    """6.3's kernel cell: the release's MPS operations at its sizes (`pt215.mps_kernels`), median ms per call."""
    from pt215.mps_kernels import release_cases
    from pt215.timing import median_seconds

    ms = {name: round(1e3 * median_seconds(fn, iters=iters, warmup=min(5, iters), device="mps", calls=calls), 4)
          for name, (fn, iters, calls) in release_cases("mps").items()}
    assert all(v > 0 for v in ms.values()), ms
    return Outcome({"median ms per call": ms})


def ch8_pipeline_nccl() -> Outcome:
    """8.1's gated cell: the pipeline memory measurement on nccl, one GPU per rank, per-edge communicators."""
    res = _launch("08-pipeline-parallelism", "pipeline_memory.py", 4, ["--backend", "nccl", "--per-edge"],
                  timeout=300).results
    peaks = {r: {str(run["budget"]): run["steps"][-1]["peak_bytes"] // 1024 for run in res[r]["runs"]}
             for r in range(4)}
    groups = {r: res[r]["per_edge"]["distinct_groups"] for r in range(4)}
    assert all(v > 0 for p in peaks.values() for v in p.values()), peaks
    return Outcome({"peak live KiB per rank and budget": peaks, "per-edge communicators per rank": groups})


# ------------------------------------------------------------------------------------------- registry


class _Skip(Exception):  # noqa: N818 - a check found a missing optional package: skipped, not failed
    """Raised by a check when an optional package its path needs is absent."""


def _fake(check: Callable[[], dict]) -> Callable[[], Outcome]:
    return lambda: Outcome(check())


_C1, _C2, _C3 = "chapters/01-collectives-nccl2", "chapters/02-flight-recorder", "chapters/03-nixl-transfers"
_C4, _C5, _C6 = "chapters/04-fsdp2-precision", "chapters/05-nvfp4-decoding", "chapters/06-fp8-mps"
PATHS: tuple[GatedPath, ...] = (
    GatedPath("ch0.cuda-devices", 0, "the GPUs the machine report lists", "chapters/00-before-you-start/"
              "00-1-environment.md", ("cuda",), ch0_gpus),
    GatedPath("ch1.collectives-nccl", 1, "the collectives tour on NCCL, equal to gloo element by element",
              f"{_C1}/collectives.py", ("cuda>=2", "nccl"), ch1_collectives),
    GatedPath("ch1.eager-init", 1, "first all_reduce: nccl-legacy lazy vs eager vs NCCL2 (always eager)",
              f"{_C1}/eager_init.py", ("cuda>=2", "nccl"), ch1_eager_init),
    GatedPath("ch1.time-estimator", 1, "dist._time_estimator on NCCL2", f"{_C1}/nccl_only.py",
              ("cuda>=2", "nccl"), ch1_time_estimator),
    GatedPath("ch1.tensor-alloc", 1, "allocate_tensor and a MemPool registered with the communicator",
              f"{_C1}/nccl_only.py", ("cuda>=2", "nccl"), ch1_tensor_alloc),
    GatedPath("ch1.shrink-group", 1, "shrink_group of a sub-group without the last rank", f"{_C1}/nccl_only.py",
              ("cuda>=2", "nccl"), ch1_shrink_group),
    GatedPath("ch1.busbw", 1, "all_reduce busbw of nccl and nccl-legacy against the link's peak",
              f"{_C1}/bandwidth.py", ("cuda>=2", "nccl"), ch1_busbw),
    GatedPath("ch1.window-put", 1, "a put + signal through an NCCL2 window (dist._new_window)",
              f"{_C1}/window_put.py", ("cuda>=2", "nccl"), ch1_window_put),
    GatedPath("ch1.time-estimate", 1, "dist._time_estimator vs the measured all_reduce time on NCCL2",
              f"{_C1}/time_estimate.py", ("cuda>=2", "nccl"), ch1_time_estimate),
    GatedPath("ch2.fr-nccl-autodump", 2, "NCCL flight-recorder dumps on timeout from every rank",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl"), ch2_fr_autodump),
    GatedPath("ch2.fr-nccl-py-watchdog", 2, "Python-watchdog dumps of the nccl2 ring buffer",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl"), ch2_fr_py_watchdog),
    GatedPath("ch2.fr-nccl-legacy-py-watchdog", 2, "Python-watchdog dumps of the legacy ProcessGroupNCCL's recorder",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl"), ch2_fr_legacy_py_watchdog),
    GatedPath("ch2.debug-server-nccl2", 2, "the debug server's health round collects every rank's NCCL2 dump",
              f"{_C2}/debug_server.py", ("cuda>=2", "nccl"), ch2_debug_server_nccl2),
    GatedPath("ch3.nixl-api-tour", 3, "NIXL one-sided reads and writes between two processes",
              f"{_C3}/api_tour.py", ("nixl",), ch3_api_tour),
    GatedPath("ch3.nixl-kv-migrate", 3, "an 8-layer KV cache pulled one-sided, bit-exact", f"{_C3}/kv_migrate.py",
              ("nixl",), ch3_kv_migrate),
    GatedPath("ch3.nixl-cuda-stream", 3, "a VRAM-to-VRAM NIXL write ordered on a stream and in a CUDA graph",
              f"{_C3}/03-1-one-sided-api.md", ("cuda", "nixl"), ch3_cuda_stream_write),
    GatedPath("ch4.fsdp-override-nccl", 4, "FSDP2 per-parameter dtypes and counts on nccl",
              f"{_C4}/fsdp_override.py", ("cuda>=2", "nccl"), ch4_fsdp_override),
    GatedPath("ch4.fsdp-cuda-graph", 4, "microbatches 1..N-1 replayed from a CUDA graph beside FSDP2, reduced once",
              f"{_C4}/fsdp_cuda_graph.py", ("cuda>=2", "nccl"), ch4_fsdp_cuda_graph),
    GatedPath("ch4.fsdp-graph-whole-step", 4, "experiment: a whole FSDP2 microbatch in a CUDA graph (what happens)",
              f"{_C4}/fsdp_cuda_graph.py", ("cuda>=2", "nccl"), ch4_fsdp_graph_whole_step),
    GatedPath("ch4.fake-graph-step", 4, "the captured accumulation step on fake CUDA (forward) and meta (step)",
              f"{_C4}/fsdp_cuda_graph.py", (), _fake(ch4_fake_graph_step), fake=True),
    GatedPath("ch5.nvfp4-scaled-mm", 5, "F.scaled_mm NVFP4 vs the dequantized reference",
              f"{_C5}/05-3-roofline.md", ("sm_100",), ch5_nvfp4),
    GatedPath("ch5.nvgemm", 5, "the NVFP4 GEMM compiled with NVGEMM allowed, and which kernel ran",
              f"{_C5}/05-3-roofline.md", ("sm_100",), ch5_nvgemm),
    GatedPath("ch5.paged-attention", 5, "causal paged GQA decode through varlen_attn vs the reference",
              f"{_C5}/05-4-paged-attention.md", ("sm_90",), ch5_paged_attention),
    GatedPath("ch5.fake-nvfp4", 5, "the NVFP4 scaled_mm call on fake CUDA tensors", f"{_C5}/05-3-roofline.md",
              (), _fake(fake_cuda.check_nvfp4_scaled_mm), fake=True),
    GatedPath("ch5.fake-scale-fold", 5, "Inductor's _scaled_mm * scale fold into NVGEMM's alpha, on fake CUDA",
              f"{_C5}/05-3-roofline.md", (), _fake(ch5_fake_scale_fold), fake=True),
    GatedPath("ch5.fake-varlen", 5, "varlen_attn paged GQA: argument checks and backend choice per GPU",
              f"{_C5}/05-4-paged-attention.md", (), _fake(fake_cuda.check_varlen_paged_gqa), fake=True),
    GatedPath("ch6.fp8-cuda", 6, "CUDA FP8 scaled_mm, tensorwise and rowwise, vs the CPU reference",
              f"{_C6}/06-1-fp8-scaled-mm.md", ("cuda", "sm_89"), ch6_fp8_cuda),
    GatedPath("ch6.fp8-mps", 6, "MPS FP8 scaled_mm vs the CPU reference; e5m2 on MPS",
              f"{_C6}/06-1-fp8-scaled-mm.md", ("mps", "macos>=15"), ch6_fp8_mps),
    GatedPath("ch6.moe-mps", 6, "MoE experts (grouped_mm, bf16 loop, FP8 loop) on MPS vs CPU",
              f"{_C6}/06-2-moe-decode-streams.md", ("mps", "macos>=15"), ch6_moe_mps),
    GatedPath("ch6.mps-streams", 6, "two MPS streams give the same result", f"{_C6}/06-2-moe-decode-streams.md",
              ("mps", "macos>=15"), ch6_mps_streams),
    GatedPath("ch6.mps-record-stream", 6, "a tensor used on a side MPS stream, kept alive by record_stream",
              f"{_C6}/06-3-mps-record-stream-kernels.md", ("mps", "macos>=15"), ch6_mps_record_stream),
    GatedPath("ch6.mps-kernels", 6, "the release's MPS operations at its sizes (gemv, 1-row softmax, upsample "
              "backward, norms, QR) timed on MPS",
              f"{_C6}/06-3-mps-record-stream-kernels.md", ("mps", "macos>=15"), ch6_mps_kernels),
    GatedPath("ch6.fake-fp8", 6, "FP8 scaled_mm tensorwise/rowwise on fake CUDA (pt215.fp8.scaled_matmul)",
              f"{_C6}/06-1-fp8-scaled-mm.md", (), _fake(fake_cuda.check_fp8_scaled_mm), fake=True),
    GatedPath("ch6.fake-scaled-mm-layout", 6, "torch._scaled_mm rejects a row-major mat2 on CUDA",
              f"{_C6}/06-1-fp8-scaled-mm.md", (), _fake(fake_cuda.check_torch_scaled_mm_layout), fake=True),
    GatedPath("ch6.fake-grouped-mm", 6, "F.grouped_mm with int32 offsets on fake CUDA",
              f"{_C6}/06-2-moe-decode-streams.md", (), _fake(fake_cuda.check_grouped_mm), fake=True),
    GatedPath("ch6.fake-no-host-sync", 6, "the FP8 decode path reads no device value per call",
              f"{_C6}/06-2-moe-decode-streams.md", (), _fake(fake_cuda.check_no_host_sync), fake=True),
    GatedPath("ch8.pipeline-nccl", 8, "pipeline memory per send budget and per-edge communicators on nccl",
              "chapters/08-pipeline-parallelism/08-1-memory-and-communicators.md", ("cuda>=4", "nccl"),
              ch8_pipeline_nccl),
)


# ------------------------------------------------------------------------------------------- running


def machine_record(hw: HardwareReport) -> dict[str, Any]:
    """The machine part of a record: versions, GPUs with capabilities, macOS (data/hardware-runs/README.md)."""
    driver = None
    if hw.cuda_devices:
        try:
            import subprocess

            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = None
    return {
        "torch": hw.torch, "cuda": hw.torch_cuda, "driver": driver, "nccl": hw.nccl, "cudnn": hw.cudnn,
        "python": hw.python, "platform": f"{hw.platform} {hw.machine}", "macos": hw.macos,
        "mps": hw.mps_available, "nixl": hw.nixl, "summary": hw.short(),
        "gpus": [{"name": d.name, "capability": d.sm, "memory_gib": round(d.memory_gib, 1)}
                 for d in hw.cuda_devices],
    }


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def run_paths(paths: Sequence[GatedPath], hw: HardwareReport | None = None, *, echo: bool = True
              ) -> list[dict[str, Any]]:
    """Run (or skip) each path; return one result dict per path (status passed / failed / skipped)."""
    hw = hw or hardware.report()
    results = []
    _SHARED.clear()
    for p in paths:
        row: dict[str, Any] = {"id": p.id, "chapter": p.chapter, "title": p.title, "where": p.where,
                               "needs": list(p.needs), "mode": fake_cuda.MODE if p.fake else "real"}
        missing = hardware.check(*p.needs, hw=hw) if p.needs else []
        if missing:
            row.update(status="skipped", reason="needs " + " and ".join(hardware._describe(n) for n in missing)
                       + f"; this machine: {hw.short()}")
            results.append(row)
            continue
        clock = Stopwatch()
        try:
            out = p.check()
            row.update(status="passed", figures=_jsonable(out.figures), limit=out.limit)
        except _Skip as e:
            row.update(status="skipped", reason=str(e))
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the run goes on
            lines = traceback.format_exception_only(type(e), e)
            row.update(status="failed", reason="".join(lines).strip().splitlines()[0][:500])
            if echo:
                traceback.print_exc(file=sys.stderr)
        row["seconds"] = round(clock.seconds, 2)
        results.append(row)
        if echo:
            print(f"  {p.id}: {row['status']}", file=sys.stderr, flush=True)
    return results


def status_text(row: dict[str, Any]) -> str:
    """`passed`, `passed (fake CUDA: ...)`, `skipped: reason` or `FAILED: reason`."""
    if row["status"] == "passed":
        return "passed" + (f" ({row['mode']})" if row.get("mode", "real") != "real" else "")
    if row["status"] == "skipped":
        return f"skipped: {row['reason']}"
    return f"FAILED: {row['reason']}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    width = max(len(r["id"]) for r in rows)
    lines = [f"{'path':<{width}}  ch  status", f"{'-' * width}  --  ------"]
    lines += [f"{r['id']:<{width}}  {r['chapter']:>2}  {status_text(r)}" for r in rows]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("passed", "failed", "skipped")}
    lines.append(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return "\n".join(lines)


def run_boundary(echo: bool = True) -> dict[str, Any]:
    """The run to the hardware boundary of every launched command (`pt215.boundary`), as a record entry."""
    from pt215 import boundary

    outcomes = boundary.run_all(timeout=90)
    failed = [o for o in outcomes if not o.ok]
    if echo:
        for o in failed:
            print(boundary.format_outcome(o))
        print(f"run to the boundary: {len(outcomes) - len(failed)} of {len(outcomes)} launched commands reach the "
              f"hardware boundary on CPU or finish; {len(failed)} fail before it")
    return {"commands": len(outcomes), "reached": sum(o.status == "boundary" for o in outcomes),
            "finished": sum(o.status == "finished" for o in outcomes),
            "failed": [{"where": o.command.where, "command": o.command.shell(), "detail": o.detail} for o in failed]}


def _select(only: str | None) -> list[GatedPath]:
    if only == "boundary":
        return []
    paths = [p for p in PATHS if only is None or only in p.id]
    if not paths:
        raise SystemExit(f"--only {only!r} matches no gated path; see --list")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m pt215.verify`; returns the exit code (1 if any check failed)."""
    p = argparse.ArgumentParser(prog="python -m pt215.verify", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="list every gated path with its chapter and needs")
    p.add_argument("--out", type=Path, help="write the JSON record of this run to this file")
    p.add_argument("--only", help="run only the paths whose id contains this text (e.g. ch5. or fake); "
                                  "'boundary': only the run to the hardware boundary")
    p.add_argument("--skip-boundary", action="store_true",
                   help="leave out the run of every launched command to its first hardware call")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    paths = _select(a.only)
    with_boundary = not a.skip_boundary and a.only in (None, "boundary")
    if a.list:
        width = max((len(x.id) for x in paths), default=0)
        for x in paths:
            needs = ", ".join(x.needs) or "nothing (fake CUDA)"
            print(f"{x.id:<{width}}  ch{x.chapter}  needs {needs:<20}  {x.title}")
        print(f"{len(paths)} gated paths")
        if with_boundary:
            from pt215.boundary import commands

            print(f"and the run to the hardware boundary of {len(commands())} launched commands "
                  "(python -m pt215.boundary --list)")
        return 0
    hw = hardware.report()
    print(f"pt215.verify on {hw.short()}, torch {hw.torch}", flush=True)
    started = _dt.datetime.now(_dt.UTC)
    clock = Stopwatch()
    rows = run_paths(paths, hw)
    if rows:
        print(format_table(rows))
    bound = run_boundary() if with_boundary else None
    if a.out is not None:
        record = {
            "schema": SCHEMA, "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python -m pt215.verify " + shlex.join(list(sys.argv[1:] if argv is None else argv)),
            "seconds": round(clock.seconds, 1), "machine": machine_record(hw), "checks": rows,
        }
        if bound is not None:
            record["boundary"] = bound
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record written to {a.out.name}")
    failed = any(r["status"] == "failed" for r in rows) or bool(bound and bound["failed"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
