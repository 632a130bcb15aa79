"""Every check of the book's gated paths (`pt215.verify.paths.PATHS`), real and fake (chapters 0-6 and 8).

The check of path `chN.some-name` is the function `chN_some_name` here: it returns an `Outcome` (the figures it
measured, the limit it compared them with), raises AssertionError when the code does not behave as the chapter
says, and `CheckSkipped` when an optional package the path needs is absent. Real checks run what the notebook
cell or chapter script runs (the script itself through `pt215.launch.run`, found through `pt215.book_files`, or
the `pt215` function the cell calls). Fake checks make the CUDA calls on FakeTensors of a simulated GPU
(`pt215.verify.fake_cuda`): shapes and dtypes checked, no kernel ran. `python -m pt215.verify` runs them.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import DataDependentOutputException

from pt215 import hardware
from pt215.book_files import chapter_script
from pt215.verify.fake_cuda import cuda_tensor, expect_error, shape_dtype, simulated_gpu
from pt215.verify.paths import CheckSkipped, Outcome

# ----------------------------------------------------------------------------------------------- helpers


def _launch(chapter: str, script: str, nproc: int, args: Sequence[str] = (), timeout: float = 180,
            env: dict[str, str] | None = None):
    """Launch `chapters/<chapter>/<script>` from its chapter folder, as the notebook does (`pt215.launch.run`)."""
    from pt215.launch import run

    path = chapter_script(f"{chapter}/{script}")
    return run(path.name, nproc=nproc, args=list(args), timeout=timeout, env=env, cwd=path.parent, stream=False,
               show=False)


def _ngpu(cap: int | None = None) -> int:
    n = torch.cuda.device_count()
    return n if cap is None else min(cap, n)


_SHARED: dict[str, Any] = {}
"""Results shared by several paths within one run (`clear_shared` starts a run afresh)."""


def clear_shared() -> None:
    """Forget the launches earlier paths shared (`pt215.verify.run_paths` calls it before a run)."""
    _SHARED.clear()


def _once(key: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` once per verify run (several paths check one launch of the same script)."""
    if key not in _SHARED:
        _SHARED[key] = fn()
    return _SHARED[key]


def _no_error(text: str, what: str) -> None:
    assert not text.split(":")[0].endswith(("Error", "Exception")), f"{what}: {text}"


# --------------------------------------------------------------------------------------- chapter 0 and 1


def ch0_cuda_devices() -> Outcome:
    hw = hardware.report()
    assert hw.cuda_devices and all(d.memory_gib > 0 for d in hw.cuda_devices)
    return Outcome({"gpus": [f"{d.name} ({d.sm})" for d in hw.cuda_devices]})


def ch1_collectives_nccl() -> Outcome:
    n = _ngpu(4)
    nccl = _launch("01-collectives-nccl2", "collectives.py", n, ["--backend", "nccl"]).results
    gloo = _launch("01-collectives-nccl2", "collectives.py", n, ["--backend", "gloo"]).results
    names = [k for k in gloo[0]["ops"] if k != "reduce"]
    differ = [k for k in names if any(nccl[r]["ops"][k] != gloo[r]["ops"][k] for r in range(n))]
    assert not differ, f"nccl and gloo disagree on {differ}"
    return Outcome({"ranks": n, "collectives compared with gloo": len(names)})


def ch1_blocking_wait() -> Outcome:
    """1.1's one-GPU cell: `work.wait()` behind 200 ms of GPU work, without and with TORCH_NCCL_BLOCKING_WAIT=1."""
    runs = {v: _launch("01-collectives-nccl2", "blocking_wait.py", 1, env={"TORCH_NCCL_BLOCKING_WAIT": v}).results[0]
            for v in ("0", "1")}
    off, on = runs["0"], runs["1"]
    assert off["backend_class"] == on["backend_class"] == "ProcessGroupNCCL2", runs
    assert not off["completed_at_return"] and off["wait_ms"] < 0.5 * off["busy_ms"], off
    assert on["completed_at_return"] and on["wait_ms"] > 0.5 * on["busy_ms"], on
    return Outcome({f"TORCH_NCCL_BLOCKING_WAIT={v}": {"wait_ms": round(r["wait_ms"], 1), "busy_ms": r["busy_ms"],
                                                      "completed_at_return": r["completed_at_return"]}
                    for v, r in runs.items()})


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


def ch2_fr_nccl_autodump() -> Outcome:
    return _hang_nccl([], {"TORCH_FR_DUMP_ON_TIMEOUT": "1"})


def ch2_fr_nccl_py_watchdog() -> Outcome:
    return _hang_nccl(["--py-watchdog"], None)


def ch2_fr_nccl_legacy_py_watchdog() -> Outcome:
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


def _dump_files(folder: str | Path) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if p.is_file() and p.name.startswith("rank_"))


def ch2_nccl_legacy_env_names() -> Outcome:
    """2.1's second GPU cell: on nccl-legacy, `TORCH_FR_DUMP_ON_TIMEOUT=0` alone is ignored (the backend's own list
    names only the legacy variable), `TORCH_NCCL_DUMP_ON_TIMEOUT=0` turns the timeout dump off."""
    from pt215.launch import LaunchError

    files: dict[str, list[str]] = {}
    for name in ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                _launch("02-flight-recorder", "hang_lab.py", 2, ["--case", "skip", "--backend", "nccl", "--timeout",
                                                                 "10", "--dump-dir", tmp], timeout=120,
                        env={"TORCH_DIST_USE_NCCL2": "0", name: "0"})
            except LaunchError as e:  # NCCL may abort a rank after the timeout; the files are what is checked
                print(f"  (launch ended with {type(e).__name__})")
            files[name] = _dump_files(tmp)
    assert files["TORCH_FR_DUMP_ON_TIMEOUT"], f"the legacy backend obeyed the renamed variable: {files}"
    assert not files["TORCH_NCCL_DUMP_ON_TIMEOUT"], f"the legacy backend dumped despite the legacy name: {files}"
    return Outcome({"dump files": files})


def ch2_nccl_debug_log() -> Outcome:
    """2.6's NCCL cell: a hung NCCL job with NCCL_DEBUG=INFO writes NCCL's log lines to NCCL_DEBUG_FILE."""
    from pt215.launch import LaunchError

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        log.mkdir()
        try:
            _launch("02-flight-recorder", "hang_lab.py", 2, ["--case", "skip", "--backend", "nccl", "--timeout", "10",
                                                             "--dump-dir", str(Path(tmp) / "dumps")], timeout=120,
                    env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(log / "nccl.%h.%p.log")})
        except LaunchError as e:
            print(f"  (launch ended with {type(e).__name__})")
        text = "\n".join(p.read_text(errors="replace") for p in log.glob("*.log"))
        assert "NCCL INFO" in text, "no NCCL INFO line in NCCL_DEBUG_FILE"
        return Outcome({"NCCL INFO lines": text.count("NCCL INFO"), "NCCL WARN lines": text.count("NCCL WARN")})


def ch2_dmesg_xid() -> Outcome:
    """2.6's Xid cell: read the kernel log the way the runbook says; count the NVIDIA Xid messages."""
    import subprocess

    log = subprocess.run(["dmesg", "-T"], capture_output=True, text=True)
    if log.returncode != 0:
        raise CheckSkipped("reading the kernel log needs more rights here (sudo dmesg -T)")
    xid = [ln for ln in log.stdout.splitlines() if "NVRM: Xid" in ln]
    return Outcome({"Xid lines": len(xid), "last": xid[-1] if xid else None})


# ------------------------------------------------------------------------------------------- chapter 3


def ch3_nixl_api_tour() -> Outcome:
    """The 3.1 tour: both control planes in one launch, the same values through each."""
    res = _launch("03-nixl-transfers", "api_tour.py", 2, [], timeout=150).results
    for via in ("tcp", "pg"):
        r0, r1 = res[0][via], res[1][via]
        assert r1["inbox"] == [8.0, 9.0, 10.0, 11.0] + [float(i) for i in range(4, 16)], (via, r1["inbox"])
        assert r0["gathered"] == [-(200.0 + i) for i in range(16)], (via, r0["gathered"])
    return Outcome({"ranks": 2, "control planes": 2, "inbox": len(res[1]["tcp"]["inbox"])})


def ch3_nixl_kv_migrate() -> Outcome:
    res = _launch("03-nixl-transfers", "kv_migrate.py", 2, ["--layers", "8", "--heads", "8", "--head-dim", "32",
                                                            "--seq", "512"], timeout=150).results
    dec = next(r for r in res.values() if "bit_exact" in r)
    assert dec["bit_exact"] and dec["same_output"] and dec["mib"] == 8, dec
    return Outcome({"MiB": dec["mib"], "bit_exact": dec["bit_exact"]})


def ch3_nixl_failures() -> Outcome:
    """The 3.4 launch: a dead peer's transfer never completes (only timeouts end the waits), close keeps the
    registration; with the owner's progress thread off, the bytes land but the write never completes."""
    res = _launch("03-nixl-transfers", "failures.py", 2, ["--op-timeout", "0.5"], timeout=150).results
    r0, r1 = res[0], res[1]
    assert r1["timeout"]["all_written"] and r1["early"]["arrived"] == 64 * 2**20, r1
    assert r0["progress"]["initiator"]["outcome"] == "returned 0", r0["progress"]
    assert r0["progress"]["owner"]["outcome"].startswith("TimeoutError") and r1["progress"]["owner"]["landed"]
    assert r0["work"] == {"is_completed": False, "exception": "None", "stored_error": r0["work"]["stored_error"]}
    assert r0["held"]["registrations"] >= 1 and not r0["held"]["closed"] and not r0["connected"], r0["held"]
    waits = {e["call"].split("(")[0].split(" ")[0]: e for e in r0["events"]}
    for e in r0["events"]:
        if e["outcome"].startswith("TimeoutError"):
            assert e["end"] - e["start"] >= 0.2, e
    assert waits["unregister_memory"]["outcome"].startswith("RuntimeError"), waits["unregister_memory"]
    return Outcome({"bounded waits": sum(e["outcome"].startswith("TimeoutError") for e in r0["events"]),
                    "registrations held": r0["held"]["registrations"]})


def ch3_nixl_cuda_stream() -> Outcome:
    """The 3.1 GPU cell: a CUDA-to-CUDA NIXL write ordered on a side stream, replayed from a CUDA graph, and the
    64 slots of a stream (the 65th transfer enqueued before any retired is refused)."""
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
        enqueued, refusal = 0, ""
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)  # nothing enqueued behind it can retire
            try:
                for _ in range(65):
                    a.write_stream(src_mem.to_view(), remote)  # timeout=None: the transport's default
                    enqueued += 1
            except RuntimeError as e:
                refusal = str(e)
        stream.synchronize()
        assert enqueued == 64 and "too many pending CUDA stream transfers" in refusal, (enqueued, refusal)
        return Outcome({"MiB": 4, "graph replays": 3, "stream slots": enqueued})
    finally:
        torch.cuda.synchronize()
        a.close(timeout=30)
        b.close(timeout=30)


# ------------------------------------------------------------------------------------------- chapter 4


def ch4_fsdp_override_nccl() -> Outcome:
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


def ch4_fake_graph_step() -> Outcome:
    """The captured step of fsdp_cuda_graph.py: its forward on fake CUDA (the CUDA meta checks, and no read
    of a device value, which a capture forbids); sparse dispatch refused for the same reason; the whole step
    (forward, `autograd.grad`, `_foreach_add_` into fp32 buffers) on the meta device, where autograd runs
    without a GPU (on fake CUDA its engine asks for a CUDA context)."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    from pt215.fsdp import local_grad_step

    out: dict = {}
    with simulated_gpu((9, 0)):
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
    out["sparse refused"] = expect_error(
        lambda: local_grad_step(twin, params, bufs, tokens, tokens, 0.25), "dispatch='dense'")
    return Outcome(out)


# ------------------------------------------------------------------------------------------- chapter 5


@functools.cache
def _nvfp4_operands() -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Chapter 5's NVFP4 GEMM operands (`nvfp4.mm_operands` of a seeded 16x512 activation and 256x512 weight) and
    the dequantized reference product: built once, shared by the real and the fake checks."""
    from pt215 import nvfp4

    g = torch.Generator().manual_seed(0)
    qa = nvfp4.quantize(torch.randn(16, 512, generator=g))
    qw = nvfp4.quantize(torch.randn(256, 512, generator=g) * 0.02)
    return nvfp4.mm_operands(qa, qw), qa.dequantize() @ qw.dequantize().T


def ch5_decode_roofline_gpu() -> Outcome:
    """5.3's GPU cell: `roofline.decode_sweep` in bf16 on the GPU (the model sized from its L2, at least 8 GiB),
    each step against its byte floor, and the twin of the same ops; the twin must dispatch the same aten ops."""
    from pt215 import roofline

    run = roofline.decode_sweep("cuda", dtype=torch.bfloat16, batches=(1, 16, 64), iters=10, warmup=2)
    assert run["ops"]["model"] == run["ops"]["twin"], "the twin dispatches other ops than the model"
    bw = run["read_bw"]
    figures: dict[str, object] = {"read TB/s": bw / 1e12, "bf16 GEMM TFLOP/s": run["gemm_flops"]["bf16"] / 1e12,
                                  "weights GiB": roofline.weight_bytes(run["cfg"], "bf16") / 2**30}
    for b in (1, 16, 64):
        m, tw = run["decode"][("model", b)], run["decode"][("twin", b)]
        assert m["step_s"] >= 0.7 * m["step_bytes"] / bw, f"B={b}: a step beat its byte floor"
        figures[f"B={b}"] = {"step ms": m["step_s"] * 1e3, "byte floor ms": m["step_bytes"] / bw * 1e3,
                             "twin ms": tw["step_s"] * 1e3, "fraction of read bandwidth": m["step_bytes"] / bw
                             / m["step_s"]}
    return Outcome(figures, "no step beats its byte floor; the twin dispatches the same ops")


def ch5_nvfp4_scaled_mm() -> Outcome:
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
        raise CheckSkipped("nvidia-cutlass-operators / nvidia-cutlass-dsl not installed: Inductor cannot consider "
                           "NVGEMM")
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


def ch5_nvgemm_launches() -> Outcome:
    """5.5's gated cell: the CUDA kernels one call of the compiled seven-GEMM decode layer launches, with
    ``nvgemm_pdl`` "0" and "1" (``nvfp4.layer_kernels``)."""
    from torch._inductor.utils import ensure_nv_universal_gemm_available

    from pt215 import nvfp4

    if not ensure_nv_universal_gemm_available():
        raise CheckSkipped("nvidia-cutlass-operators / nvidia-cutlass-dsl not installed: Inductor cannot consider "
                           "NVGEMM")
    figures: dict[str, object] = {}
    for pdl in ("0", "1"):
        kernels = nvfp4.layer_kernels(pdl)
        assert kernels, f"nvgemm_pdl={pdl}: the profiler saw no CUDA kernel"
        figures[f"nvgemm_pdl={pdl}"] = {"CUDA kernels": len(kernels), "names": sorted(set(kernels))}
    return Outcome(figures, "the kernels are reported, not assumed")


def ch5_fake_scale_fold() -> Outcome:
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
    return Outcome({"foldable form": fold["after"], "two-level F.scaled_mm": two_level["after"],
                    "without NVGEMM": no_nvgemm["after"], "torchao 0.18 form (bf16 0-D scale)": torchao_form["after"]})


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


def ch5_fake_nvfp4() -> Outcome:
    """The NVFP4 GEMM of chapter 5 (`pt215.nvfp4.scaled_mm`, swizzled BlockWise1x16 + TensorWise scales) on
    fake CUDA copies of the operands the real check multiplies."""
    from pt215 import nvfp4

    args, _ = _nvfp4_operands()
    with simulated_gpu((10, 0)):
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in args]
        y = nvfp4.scaled_mm(*fake)
        assert tuple(y.shape) == (16, 256) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
        # K of A (2 values per byte) must match B's: the meta check rejects a mismatch
        rejected = expect_error(lambda: nvfp4.scaled_mm(fake[0][:, :128], *fake[1:]), "")
    return Outcome({"operands": [shape_dtype(t) for t in args], "out": shape_dtype(y), "K mismatch": rejected})


def _paged_gqa_decode() -> tuple[torch.Tensor, ...]:
    """Chapter 5's paged decode operands as fake CUDA tensors (inside `simulated_gpu`): 3 sequences' queries with
    8 heads over 2 KV heads of 64, a pool of 8 pages of 256, cu_seqlens_q, seqused_k and the block table."""
    q, pages = cuda_tensor(3, 8, 64), cuda_tensor(8, 256, 2, 64)
    cu = cuda_tensor(4, dtype=torch.int32)
    su = cuda_tensor(3, dtype=torch.int32)
    bt = cuda_tensor(3, 4, dtype=torch.int32)
    return q, pages, cu, su, bt


def varlen_cases() -> dict[str, dict]:
    """Which varlen_attn backend each simulated GPU picks for chapter 5's paged GQA decode call, and why."""
    import torch.nn.attention.varlen as varlen

    names = {varlen._FLASH_ATTENTION_BACKEND: "flash", varlen._CUDNN_ATTENTION_BACKEND: "cudnn"}
    cases = {
        "sm_90, cuDNN 9.26, decode enabled": ((9, 0), 92600, False),
        "sm_90, cuDNN 9.26, decode disabled": ((9, 0), 92600, True),
        "sm_100, cuDNN 9.23": ((10, 0), 92300, False),
        "sm_120, cuDNN 9.26": ((12, 0), 92600, False),
    }
    out = {}
    for label, (cap, cudnn, off) in cases.items():
        with simulated_gpu(cap, cudnn, off):
            q, kp, cu, su, bt = _paged_gqa_decode()
            reasons = varlen._cudnn_rejection_reasons(q, kp, kp, cu, None, 1, [-1, 0], su, bt)
            backend = names.get(varlen._select_backend(q, kp, kp, cu, None, 1, [-1, 0], su, bt), "?")
        out[label] = {"backend": backend, "cudnn rejects": reasons}
    return out


def ch5_fake_varlen() -> Outcome:
    """`varlen_attn` on a paged bf16 GQA cache, causal decode (max_q == 1): its own argument checks, backend
    selection and output shape on simulated sm_90/sm_100 GPUs; the rules chapter 5 states (chapter 5)."""
    import torch.nn.attention.varlen as varlen
    from torch.nn.attention.varlen import varlen_attn

    with simulated_gpu((9, 0), 92600):
        q, kp, cu, su, bt = _paged_gqa_decode()
        o = varlen_attn(q, kp, kp, cu, None, 1, 700, window_size=(-1, 0), enable_gqa=True, seqused_k=su,
                        block_table=bt)
        assert tuple(o.shape) == (3, 8, 64) and o.dtype == torch.bfloat16
        kp3 = cuda_tensor(8, 256, 3, 64)
        gqa = expect_error(lambda: varlen_attn(q, kp3, kp3, cu, None, 1, 700, enable_gqa=True,
                                               seqused_k=su, block_table=bt), "multiple of kv heads")
        no_used = varlen._cudnn_rejection_reasons(q, kp, kp, cu, None, 1, [-1, 0], None, bt)
        assert "block_table requires seqused_k" in no_used, no_used
        odd_page = varlen._cudnn_rejection_reasons(q, cuda_tensor(8, 96, 2, 64), cuda_tensor(8, 96, 2, 64), cu, None, 1,
                                                   [-1, 0], su, bt)
        assert "paged KV requires a power-of-two page size" in odd_page, odd_page
        big_head = varlen._cudnn_rejection_reasons(cuda_tensor(3, 8, 192), cuda_tensor(8, 256, 2, 192),
                                                   cuda_tensor(8, 256, 2, 128), cu, None, 2, [-1, 0], su, bt)
        assert any("head dimensions" in r for r in big_head), big_head  # sm_90: <= 128 only
    with simulated_gpu((10, 0), 92400):
        ok = varlen._cudnn_rejection_reasons(cuda_tensor(3, 8, 192), cuda_tensor(8, 256, 2, 192),
                                             cuda_tensor(8, 256, 2, 128), cu, None, 2, [-1, 0], su, bt)
        assert not any("head dimensions" in r for r in ok), ok  # sm_100 + cuDNN 9.24: (192, 128) accepted
    cases = varlen_cases()
    assert cases["sm_90, cuDNN 9.26, decode disabled"]["backend"] == "flash"
    assert cases["sm_120, cuDNN 9.26"]["cudnn rejects"] == ["cuDNN >= 9.18 on SM90 or SM100 is required"]
    return Outcome({"out": shape_dtype(o), "GQA 8 over 3 heads": gqa, "backend by GPU": cases})


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
            for od in (torch.float32, torch.bfloat16):  # rowwise fp32 out goes to the kernel as asked (6.1)
                y_dev = fp8.scaled_matmul(x[:m].to(device), qd, out_dtype=od).cpu()
                y_cpu = fp8.scaled_matmul(x[:m], q, out_dtype=od)
                assert y_dev.dtype == od, (sc, m, y_dev.dtype)
                err = fp8.rel_error(y_cpu.float(), y_dev.float())
                assert err < 2e-2, (sc, m, od, err)
                figures[f"{sc} M={m} {str(od).replace('torch.', '')}"] = err
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
    """6.2's stream cell: two MPS streams give the same result; what the inherited `torch.Stream` methods
    `wait_stream` and `record_event`, which `torch.mps` does not guard, do on a side stream (recorded, not
    asserted: the book has not run them)."""
    a = torch.randn(256, 256, device="mps")
    s1, s2 = torch.mps.Stream(), torch.mps.Stream()
    with torch.mps.stream(s1):
        r1 = torch.tanh(a @ a)
    with torch.mps.stream(s2):
        r2 = torch.tanh(a @ a)
    s1.synchronize()
    s2.synchronize()
    assert torch.allclose(r1, r2)
    figures: dict[str, object] = {"streams": 2}
    for name, call in (("s2.wait_stream(s1)", lambda: s2.wait_stream(s1)), ("s1.record_event()", s1.record_event)):
        try:
            figures[name] = f"returned {call()!r}"
        except Exception as e:  # noqa: BLE001 - what it raises is the finding
            figures[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return Outcome(figures)


def ch6_mps_record_stream() -> Outcome:
    """6.3's first GPU cell: a tensor used on a side MPS stream, marked with `record_stream`, freed only after
    the side stream is synchronized."""
    side = torch.mps.Stream()
    x = torch.randn(2048, 2048, device="mps")
    torch.mps.synchronize()
    with torch.mps.stream(side):
        y = x @ x
    x.record_stream(side)
    side.synchronize()
    del x
    z = torch.randn(2048, 2048, device="mps")
    assert bool(torch.isfinite(y).all()) and tuple(z.shape) == (2048, 2048)
    return Outcome({"side-stream result finite": True})


def ch6_mps_kernels() -> Outcome:
    """6.3's kernel cell: the release's MPS operations at its sizes (`pt215.mps_kernels`), median ms per call,
    and each gemv's floor (weight bytes / the read bandwidth measured here) as the control it is read against."""
    from pt215.mps_kernels import release_cases
    from pt215.roofline import decode_floor_seconds, read_bandwidth
    from pt215.timing import median_seconds

    cases = release_cases("mps")
    ms = {name: round(1e3 * median_seconds(c.fn, iters=c.iters, warmup=min(5, c.iters), device="mps",
                                           calls=c.calls), 4) for name, c in cases.items()}
    assert all(v > 0 for v in ms.values()), ms
    bw = read_bandwidth(device="mps")
    floors = {name: round(1e3 * decode_floor_seconds(c.nbytes, bw), 4) for name, c in cases.items() if c.nbytes}
    return Outcome({"median ms per call": ms, "floor ms (bytes / read bandwidth)": floors,
                    "read GB/s": round(bw / 1e9, 1)})


def ch6_fake_fp8() -> Outcome:
    """`pt215.fp8.scaled_matmul` (F.scaled_mm v2), tensorwise and rowwise, on a simulated sm_90 (chapter 6)."""
    from pt215 import fp8

    out = {}
    with simulated_gpu((9, 0)):
        x = cuda_tensor(16, 256)
        for scaling in ("tensorwise", "rowwise"):
            w = fp8.quantize(cuda_tensor(128, 256), scaling=scaling)
            assert w.data.dtype == torch.float8_e4m3fn and w.scale.dtype == torch.float32
            assert tuple(w.scale.shape) == (() if scaling == "tensorwise" else (128, 1))
            for out_dtype in (torch.bfloat16, torch.float32):
                y = fp8.scaled_matmul(x, w, out_dtype=out_dtype)
                assert y.device.type == "cuda" and tuple(y.shape) == (16, 128) and y.dtype == out_dtype
            out[scaling] = shape_dtype(y)
        assert fp8.scaled_mm_path("cuda") == "scaled_mm"
    with simulated_gpu((8, 0)):
        out["sm_80 path"] = fp8.scaled_mm_path("cuda")
        assert out["sm_80 path"] == "dequantize"
    return Outcome(out)


def ch6_fake_scaled_mm_layout() -> Outcome:
    """`torch._scaled_mm` (v1) on cuda: column-major mat2 accepted, row-major rejected (chapter 6)."""
    from pt215 import fp8

    with simulated_gpu((9, 0)):
        a = cuda_tensor(64, 128, dtype=torch.float8_e4m3fn)
        b_rows = cuda_tensor(128, 32, dtype=torch.float8_e4m3fn)   # row-major (K, N)
        b_cols = b_rows.t().contiguous().t()                # the same shape, column-major
        s = torch.ones((), device="cuda")
        y = torch._scaled_mm(a, b_cols, s, s, out_dtype=torch.bfloat16)
        assert tuple(y.shape) == (64, 32) and y.dtype == torch.bfloat16
        rejected = expect_error(lambda: torch._scaled_mm(a, b_rows, s, s, out_dtype=torch.bfloat16),
                                "mat2 must be col_major")
        problems = fp8.cuda_layout_problems(a, b_rows)
        assert any("column-major" in p for p in problems), problems
        assert fp8.cuda_layout_problems(a, b_cols) == []
    return Outcome({"col_major": shape_dtype(y), "row_major": rejected})


def ch6_fake_grouped_mm() -> Outcome:
    """`pt215.moe.moe_grouped` (F.grouped_mm, int32 offsets) and the int64-offsets rejection (chapter 6)."""
    from pt215 import moe

    with simulated_gpu((9, 0)):
        x, w = cuda_tensor(48, 64), cuda_tensor(4, 128, 64)
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        y = moe.moe_grouped(x, w, offs, validate=False)  # the timed path: no read of offs
        assert tuple(y.shape) == (48, 128) and y.dtype == torch.bfloat16
        rejected = expect_error(lambda: F.grouped_mm(x, w.transpose(-2, -1), offs=offs.long()), "int32")
    return Outcome({"grouped_mm": shape_dtype(y), "int64 offs": rejected})


def ch6_fake_no_host_sync() -> Outcome:
    """The FP8 decode path never reads device values per call: quantize, scaled_matmul, and the FP8 expert
    loop given its boundaries once per layer (chapter 6's timing compares kernels, not syncs)."""
    from pt215 import fp8, moe

    with simulated_gpu((9, 0)):
        x = cuda_tensor(16, 64)
        # the detector works: a value read on a fake tensor raises
        expect_error(lambda: bool(torch.isfinite(x).all()), "", kinds=(DataDependentOutputException,))
        q = fp8.quantize(x, scaling="rowwise")
        experts = [fp8.quantize(cuda_tensor(32, 64), scaling="rowwise") for _ in range(4)]
        y = fp8.scaled_matmul(x, experts[0])
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        z = moe.moe_loop_fp8(cuda_tensor(16, 64), experts, offs, validate=False, bounds=[4, 8, 12, 16])
        assert tuple(z.shape) == (16, 32)
    return Outcome({"quantize": shape_dtype(q.data), "scaled_matmul": shape_dtype(y), "moe_loop_fp8": shape_dtype(z),
                    "host reads": 0})


# ------------------------------------------------------------------------------------------- chapter 8


def ch8_pipeline_nccl() -> Outcome:
    """8.1's gated cell: the pipeline memory measurement on nccl, one GPU per rank, per-edge communicators; each
    rank's storage-level peak per run, whether the allocator control agreed, and the nccl-lazy recommendation."""
    launched = _launch("08-pipeline-parallelism", "pipeline_memory.py", 4, ["--backend", "nccl", "--per-edge"],
                       timeout=300)
    res = launched.results

    def label(run: dict) -> str:
        if run["defer_pp_recv"]:
            return f"{run['act']} defer_pp_recv"
        if not run["return_outputs"]:
            return f"{run['act']} return_outputs=False"
        return f"{run['act']} budget {run['budget']}"

    peaks = {r: {label(run): run["steps"][-1]["peak_bytes"] // 1024 for run in res[r]["runs"]} for r in range(4)}
    control = {r: all(run.get("control", {}).get("agrees", False) for run in res[r]["runs"]) for r in range(4)}
    groups = {r: res[r]["per_edge"]["distinct_groups"] for r in range(4)}
    assert all(v > 0 for p in peaks.values() for v in p.values()), peaks
    assert all(n == 4 for n in groups.values()), groups
    lazy = any("nccl-lazy" in line for line in launched.stderr.get(0, []))
    return Outcome({"peak live KiB per rank and run": peaks, "allocator control agrees, per rank": control,
                    "per-edge communicators per rank": groups, "nccl-lazy recommendation seen": lazy})


# ------------------------------------------------------------------------------------------- chapter 9


def ch9_free_threaded() -> Outcome:
    """9.1's gated cell: on a free-threaded Python, a ``load_inline(..., gil_not_used=True)`` module does not turn
    the GIL back on (``native.gil_after_extension``)."""
    from pt215 import native

    with tempfile.TemporaryDirectory() as build:
        state = native.gil_after_extension(build)
    assert state["add_one(41)"] == 42, state
    assert state["GIL after the gil_not_used extension"] == state["GIL after import torch"], state
    return Outcome(state, "the extension leaves the GIL as importing torch left it")


# --------------------------------------------------------------------------------------------- chapter 11

#: 11.2's metric pattern: step time, bytes per step (CommDebugMode and the book's counter), the router probe and the
#: final loss from rank 0's log.
AB_METRIC = (r"step_ms (?P<step_ms>[\d.]+)$|all_gather_bytes (?P<ag_bytes>\d+) reduce_scatter_bytes (?P<rs_bytes>\d+)"
             r" collectives \d+ book_counter all_gather (?P<ag_counter>\d+) reduce_scatter (?P<rs_counter>\d+)"
             r"|flips (?P<flips>[\d.]+)|final loss (?P<loss>[\d.]+)")


def ch11_ab_nccl() -> Outcome:
    """11.2's GPU cell: the upgraded job on every GPU, one short run on each NCCL class, then `pt215.ab` of
    nccl-legacy against nccl (3 runs each, interleaved): every run succeeds, the bytes per step are the same in
    both arms (the backend moves the bytes the policy decides), the final losses agree within 0.02."""
    from pt215 import ab

    n = _ngpu()
    job = chapter_script("11-capstone/job-2.15/train.py")
    gpu_args = ["--steps", "40", "--probe-every", "20", "--comm-debug-step", "2"]
    for backend in ("nccl", "nccl-legacy"):
        _launch("11-capstone", "job-2.15/train.py", n, ["--backend", backend, *gpu_args, "--steps", "3"],
                timeout=300)
    old = ab.env_from_script(chapter_script("11-capstone/job/train.py").parent / "launch.sh")
    new = ab.env_from_script(job.parent / "launch.sh")
    c = ab.compare(job, ab.Arm("nccl-legacy", old, ("--backend", "nccl-legacy"), n),
                   ab.Arm("nccl", new, ("--backend", "nccl"), n), reps=3, job_args=gpu_args, metric=AB_METRIC,
                   timeout=600)
    failed = [f"{r.arm} rep {r.rep + 1}: {r.error}" for r in c.runs if r.error]
    assert not failed, failed
    for metric in ("ag_bytes", "rs_bytes"):
        assert c.median("nccl", metric) == c.median("nccl-legacy", metric), (metric, c.pooled("nccl")[metric],
                                                                           c.pooled("nccl-legacy")[metric])
        for arm in ("nccl", "nccl-legacy"):  # CommDebugMode against the book's counter, as in the CPU cells
            assert c.median(arm, metric) == c.median(arm, metric.replace("bytes", "counter")), (arm, metric)
    loss = {arm: c.median(arm, "loss") for arm in ("nccl-legacy", "nccl")}
    assert abs(loss["nccl"] - loss["nccl-legacy"]) < 0.02, loss
    figures = {"ranks": n, "table": ab.format_table(c, digits={"loss": 4, "flips": 4, "ag_bytes": 0, "rs_bytes": 0,
                                                              "ag_counter": 0, "rs_counter": 0, "step_ms": 2,
                                                              "wall_s": 1}).splitlines()}
    return Outcome(figures, "nccl / nccl-legacy step time against the spread of 3 interleaved runs per arm")

