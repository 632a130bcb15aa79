"""Chapter 5's measurements of NVFP4 on CPU, in one run: quantizer speed, model quality, decode speed.

    .venv/bin/python chapters/05-nvfp4-decoding/nvfp4_quality_and_decode.py
    .venv/bin/python chapters/05-nvfp4-decoding/nvfp4_quality_and_decode.py --only decode

Three independent measurements (``--only`` picks one):

quantizer
    Throughput of the reference NVFP4 quantizer (`pt215.nvfp4.quantize`) next to torchao's
    `NVFP4Tensor.to_nvfp4` on the same 1024x4096 float32 input, one thread, median of 5. Varies by run.
quality
    Held-out perplexity per byte and next-token agreement with bf16, per weight format (FP8 tensorwise,
    FP8 rowwise, NVFP4; weight-only quantize-dequantize), for the dense and MoE models. Deterministic.
decode
    Notebook 3's roofline measurement (`pt215.roofline.measure_decode_roofline`, same arguments): read and copy
    bandwidth, GEMM throughput, and fp32/bf16 decode steps at B=1 and B=4, interleaved round-robin on one
    thread, with the achieved-bandwidth fraction. Varies by run; the notebook's stored output is one such run.
"""

from __future__ import annotations

import argparse
import copy
import logging

import torch
import torch.nn.functional as F

from pt215 import model as M
from pt215 import nvfp4
from pt215 import roofline as R
from pt215.timing import median_seconds

logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def bench(fn, n: int = 5) -> float:
    return median_seconds(fn, iters=n, warmup=1)


def quantizer_throughput() -> None:
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    x = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(0))
    g = per_tensor_amax_to_scale(x.abs().amax())
    t_ref = bench(lambda: nvfp4.quantize(x, g))
    t_ao = bench(lambda: NVFP4Tensor.to_nvfp4(x, per_tensor_scale=g))
    torch.set_num_threads(prev)
    print(f"quantizer, 1024x4096 fp32, 1 thread: pt215 {x.numel() / t_ref / 1e6:.1f} M elem/s, "
          f"torchao {x.numel() / t_ao / 1e6:.1f} M elem/s")


@torch.no_grad()
def quality() -> None:
    held = M.load_corpus("heldout")
    seq, nwin = 256, 24
    x = held[: seq * nwin].view(nwin, seq)
    y = held[1: seq * nwin + 1].view(nwin, seq)
    fmts = {
        "fp8-tensorwise": lambda w: nvfp4.fp8_roundtrip(w, "tensorwise"),
        "fp8-rowwise": lambda w: nvfp4.fp8_roundtrip(w, "rowwise"),
        "nvfp4": lambda w: nvfp4.quantize(w).dequantize(torch.float32),
    }

    def evaluate(m):
        logits = torch.cat([m(x[i:i + 8]) for i in range(0, nwin, 8)])
        nll = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()
        return torch.tensor(nll).exp().item(), logits.argmax(-1)

    for name in ("dense", "moe"):
        base = M.load_pretrained(name)
        ppl0, top0 = evaluate(base)
        print(f"{name:5s} bf16            ppl/byte {ppl0:.3f}  agreement 1.0000")
        for fname, f in fmts.items():
            ppl, top = evaluate(M.with_weights(base, lambda n, w, f=f: f(w)))
            print(f"{name:5s} {fname:<15} ppl/byte {ppl:.3f}  agreement {(top == top0).float().mean().item():.4f}")


def decode() -> None:
    torch.manual_seed(0)
    cfg = M.ModelConfig(d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, ffn_hidden=1408, max_seq_len=1024)
    model = M.build_model(cfg).eval()
    models = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    run = R.measure_decode_roofline(models, batches=(1, 4), context=64, iters=15, warmup=3, threads=1)
    bw = run["read_bw"]
    print(f"bandwidth ({run['threads']} thread, medians of {run['iters']} interleaved rounds): read "
          f"{bw / 1e9:.2f} GB/s, copy {run['copy_bw'] / 1e9:.2f} GB/s; GEMM fp32 "
          f"{run['gemm_flops']['fp32'] / 1e9:.1f} / bf16 {run['gemm_flops']['bf16'] / 1e9:.1f} GFLOP/s")
    for (fmt, b), r in run["decode"].items():
        achieved = r["step_bytes"] / r["step_s"]
        print(f"{fmt} decode, 22.8M-param model, B={b}, context 64: step {r['step_s'] * 1e3:.1f} ms = "
              f"{r['tokens_per_s']:.1f} tok/s; {r['step_bytes'] / 1e6:.1f} MB/step -> achieved "
              f"{achieved / 1e9:.2f} GB/s = {achieved / bw:.0%} of read bandwidth; memory ceiling "
              f"{R.predicted_tokens_per_s(r['step_bytes'], 0.0, b, bw):.1f} tok/s")


PARTS = {"quantizer": quantizer_throughput, "quality": quality, "decode": decode}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(PARTS), action="append",
                   help="run only this measurement (repeatable); default: all three")
    a = p.parse_args(argv)
    for name, part in PARTS.items():
        if a.only is None or name in a.only:
            part()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
