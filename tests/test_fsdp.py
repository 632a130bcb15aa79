"""Tests for pt215.fsdp (chapter 4): the MoE model, the precision override, the FSDP2 helpers (on a 1-rank
gloo group in this process) and the DCP metadata helpers."""

import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.fsdp import (
    Experts,
    MoEConfig,
    MoETransformer,
    RMSNorm,
    Router,
    TraceSpan,
    all_gather_layout,
    capture_step,
    decode_all_gather,
    draw_all_gather_bytes,
    draw_comm_timeline,
    expert_load,
    fsdp_units,
    graph_split_accumulation,
    keep_fp32_override,
    local_grad_step,
    metadata_state_lengths,
    plain_twin,
    profile_spans,
    record_forward_dtypes,
    reduce_cost_text,
    reduce_scatter_ms,
    reduce_scatter_widget,
    router_flip_rate,
    routing_flips,
    shard_model,
    strip_stride_metadata,
    synthetic_batch,
    trace_spans,
    unsharded_params,
)
from pt215.launch import run

CFG = MoEConfig()


def _model(seed: int = 0, cfg: MoEConfig = CFG) -> MoETransformer:
    torch.manual_seed(seed)
    return MoETransformer(cfg)


@pytest.mark.parametrize("kwargs, match", [
    ({"dim": 0}, "dim must be a positive int"),
    ({"dim": 30, "n_heads": 4}, "divisible by n_heads"),
    ({"top_k": 9}, "top_k"),
    ({"dispatch": "ragged"}, "dispatch must be"),
    ({"aux_coef": -1.0}, "aux_coef"),
    ({"n_layers": True}, "n_layers must be a positive int"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(**kwargs)


@pytest.mark.parametrize("seed", [0, 1])
def test_forward_shapes_routing_and_loss(seed):
    m = _model(seed)
    x, y = synthetic_batch(CFG, batch=2, seq=8, seed=seed)
    total, ce = m.loss(x, y)
    logits = m(x)
    assert logits.shape == (2, 8, CFG.vocab_size) and logits.dtype == torch.float32
    routes = m.routing()
    assert len(routes) == CFG.n_layers
    for idx in routes:
        assert idx.shape == (16, CFG.top_k)
        assert int(idx.min()) >= 0 and int(idx.max()) < CFG.n_experts
        assert (idx.sort(-1).values[:, 1:] != idx.sort(-1).values[:, :-1]).all()  # k distinct experts
    assert torch.isfinite(total) and total >= ce


def test_model_rejects_float_tokens_and_needs_forward():
    m = _model()
    with pytest.raises(ValueError, match="tokens must be a 2-D integer tensor"):
        m(torch.zeros(2, 4))
    with pytest.raises(RuntimeError, match="run a forward first"):
        m.routing()


@pytest.mark.parametrize("seed", [0, 3])
def test_dense_dispatch_matches_sparse(seed):
    sparse = _model(seed)
    dense = _model(seed, MoEConfig(dispatch="dense"))
    x, _ = synthetic_batch(CFG, batch=2, seq=8, seed=seed)
    torch.testing.assert_close(dense(x), sparse(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_are_each_experts_silu_mlp_bit_for_bit(dtype):
    """`Experts` (`pt215.moe.expert_mlp`) is each expert's SiLU MLP on its tokens, mixed with the router weights:
    bit for bit the per-expert loop chapter 4's stored outputs were made with, at the chapter's sizes (top-2)."""
    ex = Experts(8, 32, 64).to(dtype)
    x = torch.randn(64, 32).to(dtype)
    probs, idx, w = Router(32, 8, 2)(x.float())
    ref = torch.zeros_like(x)
    for e in range(8):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        h = F.silu(x[tok] @ ex.w_in[e]) @ ex.w_out[e]
        ref.index_add_(0, tok, h * w[tok, slot].unsqueeze(-1).to(h.dtype))
    assert torch.equal(ex(x, probs, idx, w), ref)


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_returns_input_dtype(wdtype):
    n = RMSNorm(8).to(wdtype)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = n(x)
    assert out.dtype == torch.bfloat16
    rms = out.float().pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(3), rtol=2e-2, atol=2e-2)


def test_keep_fp32_override_selects_router_and_norms():
    m = _model()
    fn, kept = keep_fp32_override(m)
    assert kept == ["blocks.0.norm1.weight", "blocks.0.norm2.weight", "blocks.0.moe.router.gate.weight",
                    "blocks.1.norm1.weight", "blocks.1.norm2.weight", "blocks.1.moe.router.gate.weight",
                    "norm.weight"]
    for name, p in m.named_parameters():
        assert fn(p) == (torch.float32 if name in kept else None)
    # the same names on another rank/build give the same decisions
    _, kept2 = keep_fp32_override(_model(seed=5))
    assert kept2 == kept
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn)
    resolved = {n: policy._resolve_for_param(p).param_dtype for n, p in m.named_parameters()}
    assert all(resolved[n] == (torch.float32 if n in kept else torch.bfloat16) for n in resolved)


@pytest.mark.parametrize("bad", ["router", [""], [3]])
def test_keep_fp32_override_rejects_bad_keep(bad):
    with pytest.raises(ValueError, match="keep must be a sequence of non-empty strings"):
        keep_fp32_override(_model(), keep=bad)


def test_synthetic_batch_is_deterministic_and_shifted():
    a, ta = synthetic_batch(CFG, 3, 10, seed=7)
    b, tb = synthetic_batch(CFG, 3, 10, seed=7)
    assert torch.equal(a, b) and torch.equal(ta, tb)
    assert torch.equal(a[:, 1:], ta[:, :-1])
    with pytest.raises(ValueError, match="seq >= 2"):
        synthetic_batch(CFG, 1, 1, seed=0)


def test_expert_load_and_routing_flips():
    idx = torch.tensor([[0, 1], [1, 2], [0, 1]])
    load = expert_load(idx, 4)
    torch.testing.assert_close(load, torch.tensor([2, 3, 1, 0]) / 6.0)
    assert routing_flips(idx, idx[:, [1, 0]]) == 0.0       # order inside the top-k set does not matter
    assert routing_flips(idx, torch.tensor([[0, 1], [1, 3], [0, 1]])) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="same shape"):
        routing_flips(idx, idx[:2])
    with pytest.raises(ValueError, match="integer tensor"):
        expert_load(idx.float(), 4)


@pytest.mark.parametrize("n_experts", [8, 64])
def test_router_flip_rate(n_experts):
    fp32 = router_flip_rate(64, n_experts, tokens=512, weight_dtype=torch.float32, input_dtype=torch.float32)
    low = router_flip_rate(64, n_experts, tokens=512)
    assert fp32 == 0.0 and 0.0 <= low < 0.2
    with pytest.raises(ValueError, match="top_k"):
        router_flip_rate(8, 2, top_k=3)


# ---------------------------------------------------------------- FSDP2 on a 1-rank gloo group


@pytest.fixture(scope="module")
def pg():
    if dist.is_initialized():
        pytest.skip("a process group already exists")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("override", [True, False])
def test_sharded_forward_dtypes_one_rank(pg, override):
    """On 1 rank FSDP2 skips the collectives, but the units, forward dtypes and grad dtypes are the same."""
    m = _model()
    fn, kept = keep_fp32_override(m)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn if override else None)
    shard_model(m, policy)
    assert list(fsdp_units(m)) == ["root", "blocks.0", "blocks.1"]
    table, hooks = record_forward_dtypes(m)
    loss, _ = m.loss(*synthetic_batch(CFG, 2, 8, seed=0))
    for mod, row in table.items():
        for pname, dt in row.items():
            if pname != "__input":
                want = "float32" if override and f"{mod}.{pname}" in kept else "bfloat16"
                assert dt == want, (mod, pname)
    for h in hooks:
        h.remove()
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in m.parameters())


def test_twin_shares_fsdp_unsharded_parameters_and_accumulates_like_fsdp(pg):
    """fsdp_cuda_graph.py's captured step, run eagerly: the hook-free twin holds FSDP2's unsharded parameters
    (same objects), computes the same loss, and `local_grad_step` adds the same gradients FSDP2 accumulates."""
    cfg = MoEConfig(dispatch="dense")
    m = _model(cfg=cfg)
    fn, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn))
    with pytest.raises(RuntimeError, match="still sharded"):
        unsharded_params(m)
    m.set_manual_backward_finalization(True)
    m.set_requires_gradient_sync(False)
    m.set_reshard_after_forward(False)
    m.set_reshard_after_backward(False)
    x, y = synthetic_batch(cfg, 2, 8, seed=0)
    loss = m.loss(x, y)[0]
    loss.backward()
    params = unsharded_params(m)
    twin = plain_twin(m)
    assert all(q is params[n] for n, q in twin.named_parameters())
    assert {str(q.dtype) for q in params.values()} == {"torch.bfloat16", "torch.float32"}
    assert torch.equal(twin.loss(x, y)[0], loss.detach())
    fsdp_grads = [q.grad.clone() for q in params.values()]
    bufs = [torch.zeros_like(g) for g in fsdp_grads]
    step = local_grad_step(twin, list(params.values()), bufs, x, y, 1.0)
    step()
    step()
    assert all(torch.equal(b, 2 * g) for b, g in zip(bufs, fsdp_grads, strict=True))
    m.set_requires_gradient_sync(True)
    m.finalize_backward()
    with pytest.raises(ValueError, match="one buffer per parameter"):
        local_grad_step(twin, list(params.values()), bufs[:-1], x, y, 1.0)
    with pytest.raises(ValueError, match="dispatch='dense'"):
        local_grad_step(_model(), [], [], x, y, 1.0)
    with pytest.raises(TypeError, match="must be a MoETransformer"):
        plain_twin(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        capture_step(step, warmup=0)


def test_captured_step_shape_checks_on_fake_cuda():
    """`python -m pt215.verify`'s fake check of the captured step: forward on fake CUDA, the whole step on meta."""
    from pt215.verify.checks import ch4_fake_graph_step

    out = ch4_fake_graph_step().figures
    assert out["forward (fake cuda)"] == "loss [] float32"
    assert "aten.bincount" in out["sparse dispatch"]  # moe.sort_routes' expert counts: a data-dependent shape
    assert out["step (meta)"].startswith("17 fp32 gradient buffers")


_WORKER = """
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from pt215.fsdp import *
from pt215.launch import init_rank, report, shutdown
rank = init_rank("gloo").rank
cfg = MoEConfig()
out = {}
def build(policy_kw, override=False):
    torch.manual_seed(0)
    m = MoETransformer(cfg)
    fn, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                        param_dtype_override_fn=fn if override else None, **policy_kw))
    return m, install_comm_counters(m)
x, y = synthetic_batch(cfg, 2, 8, seed=rank)
modes = [("override", {}, True), ("bf16", {}, False), ("reduce_bf16", {"reduce_dtype": torch.bfloat16}, False)]
for label, kw, ov in modes:
    m, log = build(kw, ov)
    loss = m.loss(x, y)[0]
    out[label] = {"fwd": log.count("all_gather"), "fwd_dtypes": log.dtypes("all_gather")}
    loss.backward()
    out[label]["rs_dtypes"] = log.dtypes("reduce_scatter")
m, log = build({}, True)
m.set_manual_backward_finalization(True)
m.set_requires_gradient_sync(False)
for i in range(3):
    m.loss(*synthetic_batch(cfg, 2, 8, seed=10 * i + rank))[0].backward()
out["before_finalize"] = log.count("reduce_scatter")
m.set_requires_gradient_sync(True)
m.finalize_backward()
out["after_finalize"] = log.count("reduce_scatter")
m, _ = build({}, True)
log = install_comm_counters(m, keep_bytes=True)
blk = m.blocks[0]
blk.unshard()  # one all-gather of a mixed (uint8) unit, its bytes kept
rec = [r for r in log.records if r.unit == "blocks.0"][-1]
params = dict(blk.named_parameters())
shards = [(n, str(p.dtype).removeprefix("torch."), p.numel() // 2) for n, p in params.items()]
dec = decode_all_gather(rec.gathered, all_gather_layout(shards, 2))
out["gathered"] = {"dtype": rec.dtype, "n": len(rec.gathered), "sent": len(rec.sent),
                   "equal": all(torch.equal(dec[n], p.detach().reshape(-1)) for n, p in params.items())}
blk.reshard()
report(out)
shutdown()
"""


@pytest.mark.slow
def test_two_ranks_all_gather_reduce_scatter_and_finalize(tmp_path):
    """2 gloo ranks: one all-gather per unit per forward (uint8 when dtypes mix), the reduce-scatter dtype
    both ways, and one reduce-scatter per unit after manual finalization."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    res = run(str(script), 2, timeout=120, show=False)
    one = {"root": 1, "blocks.0": 1, "blocks.1": 1}
    for r in (0, 1):
        out = res.results[r]
        for label, ag, rs in [("override", "uint8", "float32"), ("bf16", "bfloat16", "float32"),
                              ("reduce_bf16", "bfloat16", "bfloat16")]:
            assert out[label]["fwd"] == one, label
            assert all(v == [ag] for v in out[label]["fwd_dtypes"].values()), label
            assert all(v == [rs] for v in out[label]["rs_dtypes"].values()), label
        assert out["before_finalize"] == {} and out["after_finalize"] == one
        # the layout computed from the parameters alone reads a real block's gathered bytes back exactly
        assert out["gathered"]["dtype"] == "uint8" and out["gathered"]["equal"]
        assert out["gathered"]["n"] == 2 * out["gathered"]["sent"]


def test_shard_model_and_units_reject_bad_input(pg):
    with pytest.raises(TypeError, match="must be a MoETransformer"):
        shard_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no fully_shard units"):
        fsdp_units(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- DCP metadata helpers


def test_strip_stride_metadata_round_trip():
    import torch.distributed.checkpoint as dcp

    src = {"t": torch.arange(12.0).reshape(3, 4).t(), "v": torch.ones(5)}
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(src, checkpoint_id=d)
        assert metadata_state_lengths(d) == [6, 6]
        assert dcp.FileSystemReader(d).read_metadata().state_dict_metadata["t"].properties.strides == (1, 4)
        assert strip_stride_metadata(d) == 2
        assert metadata_state_lengths(d) == [5, 5]
        assert dcp.FileSystemReader(d).read_metadata().state_dict_metadata["t"].properties.strides is None
        dst = {"t": torch.zeros(4, 3), "v": torch.zeros(5)}
        dcp.load(dst, checkpoint_id=d)
        assert torch.equal(dst["t"], src["t"]) and torch.equal(dst["v"], src["v"])
        with pytest.raises(FileNotFoundError, match="no .metadata"):
            strip_stride_metadata(os.path.join(d, "missing"))


def test_dcp_cross_version_writes_both_checkpoints_and_reads_them_back(tmp_path, capsys):
    """Chapter 4's cross-version script: 2.15 reads both; the stripped one has the pre-2.15 5-element layout."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "chapters/04-fsdp2-precision/dcp_cross_version.py"
    spec = importlib.util.spec_from_file_location("dcp_cross_version", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["write", str(tmp_path / "ck")]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["as-written"]["state_lengths"] == [6] and written["stripped"]["state_lengths"] == [5]
    assert mod.main(["read", str(tmp_path / "ck"), "--out", str(tmp_path / "r.json")]) == 0
    read = json.loads((tmp_path / "r.json").read_text())
    assert read["as-written"] == read["stripped"] == {"loaded": True, "values_equal": True}
    with pytest.raises(SystemExit):
        mod.main(["write", str(tmp_path / "ck")])  # not empty: refused before anything is written


# ---------------------------------------------------------------- the all-gather buffer, byte by byte


def test_all_gather_layout_is_rank_major_in_parameter_order():
    lay = all_gather_layout([("w", "bfloat16", 4), ("s", "float32", 2)], 2)
    assert [(s.rank, s.name, s.offset, s.nbytes) for s in lay] == [
        (0, "w", 0, 8), (0, "s", 8, 8), (1, "w", 16, 8), (1, "s", 24, 8)]
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.5, 0.25, 2.0, -4.0], dtype=torch.bfloat16)
    sc = torch.tensor([1.0, 1.5, 0.75, 2.0])
    raw = []
    for r in (0, 1):  # what each rank sends: its shard of each parameter, as bytes
        raw += w[4 * r:4 * r + 4].view(torch.uint8).tolist() + sc[2 * r:2 * r + 2].view(torch.uint8).tolist()
    out = decode_all_gather(raw, lay)
    assert torch.equal(out["w"], w) and torch.equal(out["s"], sc)


@pytest.mark.parametrize("args, match", [
    (([("w", "bfloat16", 4)], 0), "world must be an int >= 1"),
    (([], 2), "at least one parameter"),
    (([("w", "bfloat16", -1)], 2), "shard numel"),
    (([("w", "bf16", 4)], 2), "not a torch dtype name"),
])
def test_all_gather_layout_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        all_gather_layout(*args)


def test_decode_and_draw_check_the_buffer_size():
    import matplotlib

    matplotlib.use("Agg")
    lay = all_gather_layout([("w", "bfloat16", 4)], 2)
    with pytest.raises(ValueError, match="has 3 bytes, the layout describes 16"):
        decode_all_gather([0, 1, 2], lay)
    fig, _ = draw_all_gather_bytes([0] * 16, lay)
    assert fig is not None
    with pytest.raises(ValueError, match="too many to draw"):
        draw_all_gather_bytes([0] * 128, all_gather_layout([("w", "float32", 16)], 2))


# ---------------------------------------------------------------- collectives on a profiler timeline


def _trace() -> dict:
    ev = [
        {"ph": "X", "name": "microbatch 0", "cat": "user_annotation", "ts": 1000.0, "dur": 900.0, "tid": 1},
        {"ph": "X", "name": "c10d::_allgather_base_", "cat": "cpu_op", "ts": 1010.0, "dur": 5.0, "tid": 1},
        {"ph": "X", "name": "gloo:all_gather", "cat": "cpu_op", "ts": 1020.0, "dur": 100.0, "tid": 2},
        {"ph": "X", "name": "c10d::_reduce_scatter_base_", "cat": "cpu_op", "ts": 1500.0, "dur": 5.0, "tid": 1},
        {"ph": "X", "name": "gloo:all_reduce", "cat": "cpu_op", "ts": 1510.0, "dur": 200.0, "tid": 3},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1100.0, "dur": 5.0, "tid": 1},
        {"ph": "M", "name": "thread_name", "ts": 0, "tid": 2},
    ]
    return {"traceEvents": ev}


def test_trace_spans_keeps_collectives_backend_work_and_marks(tmp_path):
    import json

    spans = trace_spans(_trace(), marks=("microbatch",))
    assert [(s.lane, s.kind, s.name) for s in spans] == [
        ("step", "mark", "microbatch 0"), ("calls", "all_gather", "c10d::_allgather_base_"),
        ("backend", "all_gather", "gloo:all_gather"), ("calls", "reduce_scatter", "c10d::_reduce_scatter_base_"),
        ("backend", "reduce_scatter", "gloo:all_reduce")]  # gloo's all_reduce carries the reduce-scatter
    assert spans[0].start_ms == 0.0 and spans[-1].end_ms == pytest.approx(0.71)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace()))
    assert trace_spans(path, marks=("microbatch",)) == spans
    assert [s.lane for s in trace_spans(_trace())] == ["calls", "backend", "calls", "backend"]
    with pytest.raises(ValueError, match="Chrome trace"):
        trace_spans({"events": []})
    with pytest.raises(ValueError, match="not one string"):
        trace_spans(_trace(), marks="microbatch")


def test_profile_spans_reads_back_an_exported_trace_and_draws():
    import matplotlib

    matplotlib.use("Agg")
    from torch.profiler import record_function

    def step():
        with record_function("microbatch 0"):
            torch.ones(64, 64).sum()

    spans = profile_spans(step, marks=("microbatch",))
    assert [(s.lane, s.name) for s in spans] == [("step", "microbatch 0")]  # one process: no collectives
    fig, _ = draw_comm_timeline({"a": trace_spans(_trace(), marks=("microbatch",)), "b": spans})
    assert fig is not None
    with pytest.raises(TypeError, match="must be callable"):
        profile_spans(3)
    with pytest.raises(ValueError, match="at least one"):
        draw_comm_timeline({})
    assert TraceSpan("step", "mark", "x", 0.0, 1.0).end_ms == 1.0


# ---------------------------------------------------------------- what a reduce-scatter costs at scale


def test_reduce_scatter_ms_is_nccl_tests_arithmetic():
    # 8e9 fp32 gradients on 8 ranks at 450 GB/s: 32 GB x 7/8 / 450 GB/s = 62.2 ms
    assert reduce_scatter_ms(8e9, 8, 450.0) == pytest.approx(8e9 * 4 * 7 / 8 / 450e9 * 1e3)
    assert reduce_scatter_ms(8e9, 8, 450.0, bytes_per_param=2.0, per_step=4) == pytest.approx(
        4 * reduce_scatter_ms(8e9, 8, 450.0) / 2)
    assert reduce_scatter_ms(1e9, 1, 100.0) == 0.0  # one rank: nothing to exchange
    assert reduce_cost_text(8e9, 8, 450.0).splitlines() == [
        "fp32 reduce-scatters: 62.22 ms per step", "bf16 reduce-scatters: 31.11 ms per step",
        "fp32 adds:            31.11 ms per step"]


@pytest.mark.parametrize("kwargs, match", [
    ({"n_params": 0, "world": 8, "busbw_gbps": 1.0}, "n_params must be a positive number"),
    ({"n_params": 1e9, "world": 0, "busbw_gbps": 1.0}, "world must be an int >= 1"),
    ({"n_params": 1e9, "world": 8, "busbw_gbps": float("nan")}, "busbw_gbps must be a positive number"),
    ({"n_params": 1e9, "world": 8, "busbw_gbps": 1.0, "per_step": 1.5}, "per_step must be an int"),
    ({"n_params": 1e9, "world": True, "busbw_gbps": 1.0}, "world must be an int"),
])
def test_reduce_scatter_ms_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        reduce_scatter_ms(**kwargs)


def test_reduce_scatter_widget_computes_what_python_prints():
    """The widget's JavaScript gives the same three lines as `reduce_cost_text` (run with node when present)."""
    import json
    import shutil
    import subprocess

    from pt215 import fsdp

    presets = {"8B on 8 GPUs": (8e9, 8, 450.0, 1), "70B": (70e9, 64, 50.0, 8)}
    html = reduce_scatter_widget(presets).data
    assert html == reduce_scatter_widget(presets).data and 'data-preset="70B"' in html
    assert reduce_cost_text(8e9, 8, 450.0).splitlines()[0] in html  # the first preset, shown before any script
    with pytest.raises(ValueError, match="must be \\(n_params, world, busbw_gbps, per_step\\)"):
        reduce_scatter_widget({"x": (1e9, 8)})
    with pytest.raises(ValueError, match="world must be an int"):
        reduce_scatter_widget({"x": (1e9, 0, 1.0, 1)})
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript half is checked by the site test")
    cases = [(8e9, 8, 450.0, 1), (70e9, 64, 50.0, 1), (78496, 2, 0.018, 4), (1.5e9, 3, 100.0, 2), (13e9, 16, 180.0, 1),
             (2.5e8, 4, 12.5, 3)]
    loop = "console.log(JSON.stringify(globalThis.pt215ReduceCost(c[0], c[1], c[2], c[3], 4, 2)))"
    js = fsdp._COST_JS.replace("(window)", "(globalThis)") + f"\nfor (const c of {json.dumps(cases)}) {loop};"
    run_js = subprocess.run([node, "-e", js], capture_output=True, text=True, check=True, timeout=60)
    lines = run_js.stdout.splitlines()
    assert [json.loads(x) for x in lines] == [reduce_cost_text(*c) for c in cases]


@pytest.mark.parametrize("args, match", [((1, 2, 0), "micro must be an int >= 2"), ((2, 0, 0), "n_windows must be"),
                                         ((True, 1, 0), "micro must be an int")])
def test_graph_split_accumulation_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        graph_split_accumulation(*args)
