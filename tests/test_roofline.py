"""Tests for pt215.roofline (chapters 5 and 6): byte/FLOP formulas and the measurement helpers run."""

import json
import shutil
import subprocess

import pytest
import torch

from pt215 import roofline as R
from pt215.model import ModelConfig, build_model


def test_weight_bytes_per_format():
    cfg = ModelConfig()
    n = sum(c * r * k for _, c, r, k in R.gemm_param_shapes(cfg))
    torch.manual_seed(0)
    m = build_model(cfg)
    from pt215.model import gemm_weights

    assert n == sum(p.numel() for _, p in gemm_weights(m))
    bf16 = R.weight_bytes(cfg, "bf16")
    assert bf16 == pytest.approx(2 * n + 2 * (2 * cfg.n_layers + 2) * cfg.d_model)
    nv = R.weight_bytes(cfg, "nvfp4") - 2 * (2 * cfg.n_layers + 2) * cfg.d_model
    tensors = sum(c for _, c, _, _ in R.gemm_param_shapes(cfg))
    assert nv == pytest.approx(n * 0.5 + n / 16 + 4 * tensors)
    assert R.weight_bytes(cfg, "fp8-tensorwise") < R.weight_bytes(cfg, "fp8-rowwise") < bf16
    with pytest.raises(ValueError, match="fmt"):
        R.weight_bytes(cfg, "int3")


def test_moe_active_experts():
    cfg = ModelConfig(moe_experts=8, moe_top_k=2)
    assert R.expected_active_experts(cfg, 1) == pytest.approx(2)
    assert R.expected_active_experts(cfg, 10_000) == pytest.approx(8)
    assert R.weight_bytes(cfg, batch=1) < R.weight_bytes(cfg, batch=64)


def test_step_bytes_flops_and_ceiling():
    cfg = ModelConfig()
    kv = R.kv_bytes_per_token(cfg)
    assert kv == 2 * 4 * 2 * 32 * 2
    b0 = R.decode_step_bytes(cfg, batch=4, context=0)
    assert R.decode_step_bytes(cfg, batch=4, context=100) == pytest.approx(b0 + 400 * kv)
    f = R.decode_step_flops(cfg, batch=2, context=10)
    assert f == pytest.approx(2 * R.decode_step_flops(cfg, batch=1, context=10))
    assert R.predicted_tokens_per_s(1e6, 1.0, 1, 1e9) == pytest.approx(1000)
    assert R.predicted_tokens_per_s(1e6, 1e9, 1, 1e9, peak_flops=1e8) == pytest.approx(0.1)


def test_measurements_run():
    assert R.copy_bandwidth(2**20, iters=2) > 0
    assert R.read_bandwidth(2**20, iters=2) > 0
    assert R.measure_matmul_flops(64, repeats=2) > 0
    torch.manual_seed(0)
    m = build_model(ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64)).eval()
    r = R.measure_decode(m, batch=2, context=8, steps=2)
    assert r["batch"] == 2 and r["tokens_per_s"] > 0


def test_copy_bandwidth_counts_read_plus_write(monkeypatch):
    """The book's one convention: a copy of n bytes is 2n bytes of traffic."""
    monkeypatch.setattr(R, "median_seconds", lambda fn, **kw: (fn(), 0.5)[1])
    assert R.copy_bandwidth(1000, iters=1) == pytest.approx(4000.0)
    assert R.read_bandwidth(1000, iters=1) == pytest.approx(2000.0)


@pytest.mark.parametrize(("call", "match"), [(lambda: R.copy_bandwidth(0), "nbytes"),
                                             (lambda: R.copy_bandwidth(64, iters=0), "iters"),
                                             (lambda: R.read_bandwidth(True), "nbytes")])
def test_bandwidth_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_decode_step_fn_rewinds_and_interleaved_run_reports_every_variant():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64)
    m = build_model(cfg).eval()
    step = R.decode_step_fn(m, batch=2, context=8)
    first = step()
    assert first.shape == (2, 1, cfg.vocab_size) and torch.equal(step(), first)  # same position every call
    no_prefill = R.decode_step_fn(m, batch=2, context=8, prefill=False)
    assert torch.equal(no_prefill(), no_prefill())
    run = R.measure_decode_roofline({"fp32": m, "bf16": build_model(cfg).to(torch.bfloat16).eval()},
                                    batches=(1, 2), context=8, iters=2, warmup=1, bandwidth_bytes=2**16, gemm_n=16,
                                    threads=1, cached_bytes=2**12)
    assert set(run["decode"]) == {(f, b) for f in ("fp32", "bf16") for b in (1, 2)}
    r = run["decode"][("bf16", 2)]
    assert r["tokens_per_s"] == pytest.approx(2 / r["step_s"]) and r["fmt"] == "bf16"
    assert r["step_bytes"] == R.decode_step_bytes(cfg, "bf16", batch=2, context=8)
    assert run["read_bw"] > 0 and run["copy_bw"] > 0 and run["cached_read_bw"] > 0 and run["threads"] == 1
    assert run["read_bytes"] == 2**16 and set(run["gemm_flops"]) == {"fp32", "bf16"}
    with pytest.raises(ValueError, match="fmt must be one of"):
        R.measure_decode_roofline({"fp16": m.half()})
    with pytest.raises(ValueError, match="DecoderLM"):
        R.measure_decode_roofline({"x": torch.nn.Linear(2, 2)})
    with pytest.raises(ValueError, match="batches"):
        R.measure_decode_roofline({"fp32": build_model(cfg)}, batches=(0,))
    with pytest.raises(ValueError, match="read_buffer"):
        R.measure_decode_roofline({"fp32": build_model(cfg)}, read_buffer=torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="context"):
        R.decode_step_fn(m, context=0)


def _cache(root, cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(value + "\n")


def test_last_level_cache_counts_each_instance_once(tmp_path):
    for cpu in range(4):  # two L3 instances (one per pair of CPUs, as on an AMD core complex), private L2s
        _cache(tmp_path, cpu, 0, 1, "Data", "48K", str(cpu))
        _cache(tmp_path, cpu, 1, 1, "Instruction", "32K", str(cpu))
        _cache(tmp_path, cpu, 2, 2, "Unified", "2048K", str(cpu))
        _cache(tmp_path, cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert R.last_level_cache_bytes(str(tmp_path)) == 64 * 2**20
    assert R.working_set_bytes(64 * 2**20) == 256 * 2**20 and R.working_set_bytes(2**30) == 4 * 2**30
    assert R.working_set_bytes(2**20, floor=2**20) == 4 * 2**20
    with pytest.raises(ValueError, match="factor"):
        R.working_set_bytes(2**20, factor=0)


def test_this_machine_reports_a_cache_or_none():
    llc = R.last_level_cache_bytes()
    assert llc is None or llc >= 2**16
    assert R.working_set_bytes() >= 256 * 2**20


def test_sized_config_fills_the_bytes_and_the_twin_keeps_the_ops():
    cfg = R.sized_config(64 * 2**20, n_layers=2)
    assert R.weight_bytes(cfg, "fp32") >= 64 * 2**20 > R.weight_bytes(
        ModelConfig(d_model=cfg.d_model - 128, n_layers=2, n_heads=8, n_kv_heads=2,
                    ffn_hidden=128 * max(1, round(8 * (cfg.d_model - 128) / 3 / 128)), max_seq_len=cfg.max_seq_len),
        "fp32")
    twin = R.twin_config(cfg)
    assert (twin.n_layers, twin.n_heads, twin.n_kv_heads, twin.vocab_size) == (2, 8, 2, 256) and twin.d_model == 64
    big, small = R.flat_model(cfg), R.flat_model(twin)
    n = sum(p.numel() for p in big.parameters())
    flat = big.flat_weights
    assert flat.numel() >= n and flat.numel() % (2 * 2**20) == 0
    assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in big.parameters())
    half = flat.numel() // 2
    assert torch.equal(flat[:half], flat[half:])  # the copy control changes no weight
    assert R.top_level_ops(R.decode_step_fn(big, prefill=False)) == R.top_level_ops(
        R.decode_step_fn(small, prefill=False))
    with pytest.raises(ValueError, match="multiple of 2 \\* n_heads"):
        R.twin_config(cfg, d_model=40)
    with pytest.raises(ValueError, match="dtype"):
        R.flat_model(twin, dtype=torch.float16)
    with pytest.raises(TypeError, match="callable"):
        R.top_level_ops(3)


def test_decode_sweep_runs_small_and_checks_its_twin():
    run = R.decode_sweep("cpu", batches=(1, 2), context=8, iters=1, warmup=0, n_layers=1, gemm_n=32,
                         working_set=2**20)
    assert run["ops"]["model"] == run["ops"]["twin"] and sum(run["ops"]["model"].values()) > 0
    assert set(run["decode"]) == {(m, b) for m in ("model", "twin") for b in (1, 2)}
    assert run["working_set"] == 2**20 and run["read_bytes"] >= 2**20
    with pytest.raises(ValueError, match="dtype"):
        R.decode_sweep("cpu", dtype=torch.float16, working_set=2**20)


def test_decode_estimate_is_the_roofline_for_production_shapes():
    e = R.decode_estimate(R.LLAMA_8B, "bf16", bandwidth=8e12, fraction=0.5, batch=1, context=0)
    assert e["tokens_per_s"] == pytest.approx(0.5 * 8e12 / R.weight_bytes(R.LLAMA_8B, "bf16"))
    assert e["bound"] == "memory" and e["kv_gb"] == 0 and e["weights_gb"] == pytest.approx(15.0, abs=0.05)
    big = R.decode_estimate(R.LLAMA_8B, "nvfp4", bandwidth=8e12, peak_flops=1e12, batch=512)
    assert big["bound"] == "compute"
    two = R.decode_estimate(R.LLAMA_70B, "nvfp4", bandwidth=8e12, gpus=2)
    assert two["tokens_per_s"] == pytest.approx(2 * R.decode_estimate(R.LLAMA_70B, "nvfp4", bandwidth=8e12)
                                                ["tokens_per_s"])
    assert 69e9 < sum(c * r * k for _, c, r, k in R.gemm_param_shapes(R.LLAMA_70B)) < 70e9  # without the embedding
    for kw, match in (({"fraction": 0}, "fraction"), ({"fraction": 1.5}, "fraction"), ({"bandwidth": -1}, "bandwidth"),
                      ({"batch": 0}, "batch"), ({"gpus": 1.5}, "gpus")):
        with pytest.raises(ValueError, match=match):
            R.decode_estimate(R.LLAMA_8B, **{"bandwidth": 8e12, **kw})


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (README: setup installs it for vendor_js.sh)")
def test_the_calculator_computes_what_decode_estimate_computes():
    models = R._calculator_models()
    cases = [(m, f, bw, frac, pk, b, ctx, g) for m in models for f in ("bf16", "fp8-rowwise", "nvfp4")
             for bw, frac, pk, b, ctx, g in ((8e12, 0.7, 9e15, 1, 4096, 1), (3.35e12, 1.0, 1e15, 64, 512, 4),
                                             (4.8e12, 0.5, 2e12, 256, 8192, 2))]
    js = R._CALC_JS + f"\nconsole.log(JSON.stringify({json.dumps(cases)}.map(c => globalThis.pt215DecodeEstimate(" \
        f"{json.dumps(models)}[c[0]], c[1], c[2], c[3], c[4], c[5], c[6], c[7], 2))));"
    out = json.loads(subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True, timeout=60).stdout)
    cfgs = {"Llama-3 8B": R.LLAMA_8B, "Llama-3 70B": R.LLAMA_70B}
    for (m, f, bw, frac, pk, b, ctx, g), got in zip(cases, out, strict=True):
        want = R.decode_estimate(cfgs[m], f, bandwidth=bw, fraction=frac, peak_flops=pk, batch=b, context=ctx, gpus=g)
        for key in ("tokens_per_s", "per_sequence", "step_ms", "weights_gb", "kv_gb"):
            assert got[key] == pytest.approx(want[key], rel=1e-9), (m, f, key)
        assert got["bound"] == want["bound"]


def test_the_calculator_html_is_deterministic_and_checks_arguments():
    a, b = R.decode_calculator().data, R.decode_calculator().data
    assert a == b and "pt215DecodeEstimate" in a and "Llama-3 70B" in a
    with pytest.raises(ValueError, match="gpu must be one of"):
        R.decode_calculator("A100")
    with pytest.raises(ValueError, match="fraction"):
        R.decode_calculator(fraction=0)


def test_plot_roofline_returns_the_ridge():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert R.plot_roofline(ax, 1e10, 1e11, {"p": [(1.0, 1e9)]}) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="bandwidth"):
        R.plot_roofline(ax, 0, 1e11, {})
    plt.close(fig)


def test_decode_floor_is_bytes_over_read_bandwidth():
    """One decode floor for chapters 5 and 6: bytes / read bandwidth, the bytes term of the roofline ceiling."""
    assert R.decode_floor_seconds(2e6, 1e9) == pytest.approx(2e-3)
    assert R.decode_floor_seconds(0, 1e9) == 0.0
    assert R.predicted_tokens_per_s(2e6, 0.0, 4, 1e9) == pytest.approx(4 / R.decode_floor_seconds(2e6, 1e9))


@pytest.mark.parametrize(("args", "match"), [((1e6, 0), "bandwidth must be a positive"),
                                             ((1e6, -1.0), "bandwidth must be a positive"),
                                             ((-1, 1e9), "nbytes must be >= 0"),
                                             ((float("nan"), 1e9), "nbytes must be a finite number"),
                                             (("1e6", 1e9), "nbytes must be a finite number"),
                                             ((1e6, True), "bandwidth must be a finite number")])
def test_decode_floor_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        R.decode_floor_seconds(*args)
