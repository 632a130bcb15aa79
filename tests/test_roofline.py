"""Tests for pt215.roofline (chapters 5 and 6): byte/FLOP formulas and the measurement helpers run."""

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
    run = R.measure_decode_roofline({"fp32": m, "bf16": build_model(cfg).to(torch.bfloat16).eval()},
                                    batches=(1, 2), context=8, iters=2, warmup=1, bandwidth_bytes=2**16, gemm_n=16)
    assert set(run["decode"]) == {(f, b) for f in ("fp32", "bf16") for b in (1, 2)}
    r = run["decode"][("bf16", 2)]
    assert r["tokens_per_s"] == pytest.approx(2 / r["step_s"])
    assert r["step_bytes"] == R.decode_step_bytes(cfg, "bf16", batch=2, context=8)
    assert run["read_bw"] > 0 and run["threads"] == 1 and set(run["gemm_flops"]) == {"fp32", "bf16"}
    with pytest.raises(ValueError, match="fmt"):
        R.measure_decode_roofline({"fp16": m})
    with pytest.raises(ValueError, match="batches"):
        R.measure_decode_roofline({"fp32": m}, batches=(0,))
    with pytest.raises(ValueError, match="context"):
        R.decode_step_fn(m, context=0)


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
