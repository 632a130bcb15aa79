"""Measure every figure of chapter 5's closing note in one run.

    .venv/bin/python chapters/05-nvfp4-decoding/closing_note.py

Prints: reference NVFP4 quantizer throughput next to torchao's (same input, one thread); held-out perplexity and
next-token agreement with bf16 per weight format for the dense and MoE models; measured memory bandwidth, bf16
decode tokens/s and the achieved-bandwidth fraction. Timings vary from run to run; quality numbers are deterministic.
"""

from __future__ import annotations

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
    model = M.build_model(cfg).to(torch.bfloat16).eval()
    bw = R.measure_memory_bandwidth(mode="read", repeats=5)
    bw_copy = R.measure_memory_bandwidth(mode="copy", repeats=5)
    r = R.measure_decode(model, batch=1, context=64, steps=4)
    step = R.decode_step_bytes(cfg, "bf16", batch=1, context=64)
    achieved = step * r["tokens_per_s"]
    print(f"bandwidth: read {bw / 1e9:.2f} GB/s, copy {bw_copy / 1e9:.2f} GB/s ({torch.get_num_threads()} threads)")
    print(f"bf16 decode, 22.8M-param model, B=1, context 64: {r['tokens_per_s']:.2f} tok/s; "
          f"{step / 1e6:.1f} MB/step -> achieved {achieved / 1e9:.3f} GB/s = {achieved / bw:.1%} of read bandwidth; "
          f"memory ceiling {bw / step:.1f} tok/s")


if __name__ == "__main__":
    quantizer_throughput()
    quality()
    decode()
