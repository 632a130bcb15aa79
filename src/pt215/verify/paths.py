"""The catalogue of the book's hardware-gated paths (chapters 0-6, 8 and 9): what each is, where it lives, what it
needs. No torch here: the website (`pt215.site.hardware_runs`) reads it without torch.

Each path's check is the function of `pt215.verify.checks` named after its id (`ch5.fake-nvfp4` ->
`ch5_fake_nvfp4`); `python -m pt215.verify` runs them. To add a path, see CONTRIBUTING.md ("How to add a gated
path").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PATHS", "CheckSkipped", "GatedPath", "Outcome"]


@dataclass
class Outcome:
    """What a passed check measured (`figures`) and, where one applies, the limit it was compared with."""

    figures: dict[str, Any] = field(default_factory=dict)
    limit: str | None = None


class CheckSkipped(Exception):  # noqa: N818 - a skip, not an error
    """Raised by a check when an optional package its path needs is absent: the path is skipped, not failed."""


@dataclass(frozen=True)
class GatedPath:
    """One hardware-gated path of the book: where it is, what it needs, whether its check runs on fake CUDA."""

    id: str                         # "ch<chapter>.<name>"
    chapter: int
    title: str
    where: str                      # the page or script, relative to the repository root
    needs: tuple[str, ...]          # pt215.hardware needs; () = runs everywhere (fake CUDA)
    fake: bool = False              # True: FakeTensor CUDA, no kernel runs

    @property
    def check_name(self) -> str:
        """The name of its check in `pt215.verify.checks`: the id with "." and "-" as "_"."""
        return self.id.replace(".", "_").replace("-", "_")


_C1, _C2, _C3 = "chapters/01-collectives-nccl2", "chapters/02-flight-recorder", "chapters/03-nixl-transfers"
_C4, _C5, _C6 = "chapters/04-fsdp2-precision", "chapters/05-nvfp4-decoding", "chapters/06-fp8-mps"
PATHS: tuple[GatedPath, ...] = (
    GatedPath("ch0.cuda-devices", 0, "the GPUs the machine report lists", "chapters/00-before-you-start/"
              "00-1-environment.md", ("cuda",)),
    GatedPath("ch1.collectives-nccl", 1, "the collectives tour on NCCL, equal to gloo element by element",
              f"{_C1}/collectives.py", ("cuda>=2", "nccl")),
    GatedPath("ch1.blocking-wait", 1, "TORCH_NCCL_BLOCKING_WAIT=1 makes NCCL2's work.wait() block the host",
              f"{_C1}/blocking_wait.py", ("cuda", "nccl")),
    GatedPath("ch1.eager-init", 1, "first all_reduce: nccl-legacy lazy vs eager vs NCCL2 (always eager)",
              f"{_C1}/eager_init.py", ("cuda>=2", "nccl")),
    GatedPath("ch1.time-estimator", 1, "dist._time_estimator on NCCL2", f"{_C1}/nccl_only.py",
              ("cuda>=2", "nccl")),
    GatedPath("ch1.tensor-alloc", 1, "allocate_tensor and a MemPool registered with the communicator",
              f"{_C1}/nccl_only.py", ("cuda>=2", "nccl")),
    GatedPath("ch1.shrink-group", 1, "shrink_group of a sub-group without the last rank", f"{_C1}/nccl_only.py",
              ("cuda>=2", "nccl")),
    GatedPath("ch1.busbw", 1, "all_reduce busbw of nccl and nccl-legacy against the link's peak",
              f"{_C1}/bandwidth.py", ("cuda>=2", "nccl")),
    GatedPath("ch1.window-put", 1, "a put + signal through an NCCL2 window (dist._new_window)",
              f"{_C1}/window_put.py", ("cuda>=2", "nccl")),
    GatedPath("ch1.time-estimate", 1, "dist._time_estimator vs the measured all_reduce time on NCCL2",
              f"{_C1}/time_estimate.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.fr-nccl-autodump", 2, "NCCL flight-recorder dumps on timeout from every rank",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.fr-nccl-py-watchdog", 2, "Python-watchdog dumps of the nccl2 ring buffer",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.fr-nccl-legacy-py-watchdog", 2, "Python-watchdog dumps of the legacy ProcessGroupNCCL's recorder",
              f"{_C2}/hang_lab.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.debug-server-nccl2", 2, "the debug server's health round collects every rank's NCCL2 dump",
              f"{_C2}/debug_server.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.nccl-legacy-env-names", 2, "nccl-legacy ignores a renamed TORCH_FR_DUMP_ON_TIMEOUT, obeys the "
              "legacy name", f"{_C2}/hang_lab.py", ("cuda>=2", "nccl")),
    GatedPath("ch2.nccl-debug-log", 2, "NCCL_DEBUG=INFO lines of a hung NCCL job (the runbook)", f"{_C2}/hang_lab.py",
              ("cuda>=2", "nccl")),
    GatedPath("ch2.dmesg-xid", 2, "the NVIDIA Xid messages of the node's kernel log (the runbook)",
              f"{_C2}/02-6-runbook.md", ("cuda",)),
    GatedPath("ch3.nixl-api-tour", 3, "NIXL one-sided reads and writes between two processes",
              f"{_C3}/api_tour.py", ("nixl",)),
    GatedPath("ch3.nixl-kv-migrate", 3, "an 8-layer KV cache pulled one-sided, bit-exact", f"{_C3}/kv_migrate.py",
              ("nixl",)),
    GatedPath("ch3.nixl-failures", 3, "a dead NIXL peer: every wait bounded only by its timeout, close keeps the "
              "resources; an owner without its progress thread", f"{_C3}/failures.py", ("nixl",)),
    GatedPath("ch3.nixl-cuda-stream", 3, "a VRAM-to-VRAM NIXL write ordered on a stream and in a CUDA graph, and a "
              "stream's 64 slots", f"{_C3}/03-1-one-sided-api.md", ("cuda", "nixl")),
    GatedPath("ch4.fsdp-override-nccl", 4, "FSDP2 per-parameter dtypes and counts on nccl",
              f"{_C4}/fsdp_override.py", ("cuda>=2", "nccl")),
    GatedPath("ch4.fsdp-cuda-graph", 4, "microbatches 1..N-1 replayed from a CUDA graph beside FSDP2, reduced once",
              f"{_C4}/fsdp_cuda_graph.py", ("cuda>=2", "nccl")),
    GatedPath("ch4.fsdp-graph-whole-step", 4, "experiment: a whole FSDP2 microbatch in a CUDA graph (what happens)",
              f"{_C4}/fsdp_cuda_graph.py", ("cuda>=2", "nccl")),
    GatedPath("ch4.fake-graph-step", 4, "the captured accumulation step on fake CUDA (forward) and meta (step)",
              f"{_C4}/fsdp_cuda_graph.py", (), fake=True),
    GatedPath("ch5.decode-roofline-gpu", 5, "a bf16 decode step against its byte floor, with its launch-bound twin",
              f"{_C5}/05-3-roofline.md", ("cuda",)),
    GatedPath("ch5.nvfp4-scaled-mm", 5, "F.scaled_mm NVFP4 vs the dequantized reference",
              f"{_C5}/05-3-roofline.md", ("sm_100+",)),
    GatedPath("ch5.nvgemm", 5, "the NVFP4 GEMM compiled with NVGEMM allowed, and which kernel ran",
              f"{_C5}/05-3-roofline.md", ("sm_100",)),
    GatedPath("ch5.nvgemm-launches", 5, "the CUDA kernels a compiled NVFP4 decode layer launches, PDL off and on",
              f"{_C5}/05-5-nvgemm-launches.md", ("sm_100",)),
    GatedPath("ch5.paged-attention", 5, "causal paged GQA decode through varlen_attn vs the reference",
              f"{_C5}/05-4-paged-attention.md", ("sm_90",)),
    GatedPath("ch5.fake-nvfp4", 5, "the NVFP4 scaled_mm call on fake CUDA tensors", f"{_C5}/05-3-roofline.md",
              (), fake=True),
    GatedPath("ch5.fake-scale-fold", 5, "Inductor's _scaled_mm * scale fold into NVGEMM's alpha, on fake CUDA",
              f"{_C5}/05-3-roofline.md", (), fake=True),
    GatedPath("ch5.fake-varlen", 5, "varlen_attn paged GQA: argument checks and backend choice per GPU",
              f"{_C5}/05-4-paged-attention.md", (), fake=True),
    GatedPath("ch6.fp8-cuda", 6, "CUDA FP8 scaled_mm, tensorwise and rowwise, fp32 and bf16 out, vs the CPU reference",
              f"{_C6}/06-1-fp8-scaled-mm.md", ("cuda", "sm_89")),
    GatedPath("ch6.fp8-mps", 6, "MPS FP8 scaled_mm vs the CPU reference; e5m2 on MPS",
              f"{_C6}/06-1-fp8-scaled-mm.md", ("mps", "macos>=15")),
    GatedPath("ch6.moe-mps", 6, "MoE experts (grouped_mm, bf16 loop, FP8 loop) on MPS vs CPU",
              f"{_C6}/06-2-moe-decode-streams.md", ("mps", "macos>=15")),
    GatedPath("ch6.mps-streams", 6, "two MPS streams give the same result; what the inherited, unguarded "
              "wait_stream and record_event do", f"{_C6}/06-2-moe-decode-streams.md", ("mps", "macos>=15")),
    GatedPath("ch6.mps-record-stream", 6, "a tensor used on a side MPS stream, marked with record_stream and freed "
              "after the side stream is synchronized",
              f"{_C6}/06-3-mps-record-stream-kernels.md", ("mps", "macos>=15")),
    GatedPath("ch6.mps-kernels", 6, "the release's MPS operations at its sizes (gemv with rotated weights, 1-row "
              "softmax, upsample backward, norms, QR) timed on MPS, each gemv beside its floor",
              f"{_C6}/06-3-mps-record-stream-kernels.md", ("mps", "macos>=15")),
    GatedPath("ch6.fake-fp8", 6, "FP8 scaled_mm tensorwise/rowwise on fake CUDA (pt215.fp8.scaled_matmul)",
              f"{_C6}/06-1-fp8-scaled-mm.md", (), fake=True),
    GatedPath("ch6.fake-scaled-mm-layout", 6, "torch._scaled_mm rejects a row-major mat2 on CUDA",
              f"{_C6}/06-1-fp8-scaled-mm.md", (), fake=True),
    GatedPath("ch6.fake-grouped-mm", 6, "F.grouped_mm with int32 offsets on fake CUDA",
              f"{_C6}/06-2-moe-decode-streams.md", (), fake=True),
    GatedPath("ch6.fake-no-host-sync", 6, "the FP8 decode path reads no device value per call",
              f"{_C6}/06-2-moe-decode-streams.md", (), fake=True),
    GatedPath("ch8.pipeline-nccl", 8, "pipeline memory per send budget and per-edge communicators on nccl",
              "chapters/08-pipeline-parallelism/08-1-memory-and-communicators.md", ("cuda>=4", "nccl")),
    GatedPath("ch9.free-threaded", 9, "the GIL stays disabled after importing torch and a gil_not_used extension",
              "chapters/09-native-code/09-1-extensions.md", ("free-threaded",)),
    GatedPath("ch11.ab-nccl", 11, "the capstone job's A/B on every GPU: nccl-legacy against nccl, interleaved, "
              "bytes and loss checked", "chapters/11-capstone/11-2-ab.md", ("cuda>=2", "nccl")),
)
