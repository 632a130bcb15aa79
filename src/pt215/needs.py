"""The vocabulary of hardware needs, without torch: what `pt215.hardware.requires` accepts and how it says them.

A need is `cuda`, `cuda>=N` (N GPUs), `sm_NN` or `sm_NN+` (a compute capability; see `sm_admits`), `mps`, `macos>=N`,
`nixl`, `torchao`, `nccl` or `free-threaded` (a Python without the GIL). Used by `pt215.hardware` (the gates,
chapter 0), `pt215.verify.paths` (the paths `python -m pt215.verify` runs) and the website's hardware-runs lists,
which must not import torch.
"""

from __future__ import annotations

import re

__all__ = ["GATES", "NEED", "VOCABULARY", "parse_need", "describe_need", "sm_admits", "version_tuple"]

NEED = re.compile(r"^(cuda(?:>=(\d+))?|sm_(\d+\+?)|mps|macos>=(\d+(?:\.\d+)?)|nixl|torchao|nccl|free-threaded)$")
VOCABULARY = ("'cuda', 'cuda>=N', 'sm_NN' (e.g. 'sm_90', 'sm_100'), 'sm_NN+' (e.g. 'sm_100+'), 'mps', 'macos>=N', "
              "'nixl', 'torchao', 'nccl', 'free-threaded'")


#: The needs the chapters gate on, each with what it is used for (notebook 0.1 prints which ones a machine meets).
#: `sm_100` is an architecture family: NVGEMM's tcgen05 GEMM kernel and cuDNN's SM100 attention run on sm_10x
#: only. `sm_100+` is a floor: torch's own NVFP4 `F.scaled_mm` gate (`SM100OrLater`) admits sm_12x too.
GATES: dict[str, str] = {
    "cuda>=2": "ch. 1-2: NCCL across GPUs",
    "cuda": "ch. 3-4: VRAM transfers, CUDA graphs",
    "sm_90": "ch. 5: cuDNN paged-KV attention",
    "sm_100+": "ch. 5: NVFP4 GEMM (capability 10.0 or later, incl. sm_120)",
    "sm_100": "ch. 5: NVGEMM's tcgen05 kernel (the sm_10x family only)",
    "mps": "ch. 6: FP8 on Apple MPS",
    "macos>=15": "ch. 6: MPS FP8 needs macOS 15",
    "nixl": "ch. 3: NIXL transport",
    "torchao": "ch. 5: torchao cross-check",
}


def parse_need(need: object) -> re.Match[str]:
    """The match of `need` against the vocabulary; ValueError naming the need and the vocabulary otherwise."""
    m = NEED.match(need) if isinstance(need, str) else None
    if m is None:
        raise ValueError(f"unknown requirement {need!r}; expected one of: {VOCABULARY}")
    return m


def describe_need(need: str) -> str:
    """A need in words (`"cuda>=2"` -> ">= 2 CUDA GPUs"), as skip lines, verify and the website say it."""
    m = parse_need(need)
    if need == "cuda":
        return "a CUDA GPU"
    if m.group(2):
        return f">= {m.group(2)} CUDA GPUs"
    if m.group(3):
        cc = int(m.group(3).rstrip("+"))
        if m.group(3).endswith("+"):
            return f"a CUDA GPU of compute capability sm_{cc} or later (any architecture)"
        if cc >= 100:
            return f"a CUDA GPU of the sm_{cc // 10}x family (sm_{cc}+, not a later architecture)"
        return f"a CUDA GPU of compute capability sm_{cc}+"
    if need == "mps":
        return "Apple MPS"
    if m.group(4):
        return f"macOS >= {m.group(4)}"
    if need == "nccl":
        return "NCCL with a CUDA GPU"
    if need == "free-threaded":
        return "a free-threaded Python (3.14t, GIL disabled)"
    return f"the `{need}` package"


def version_tuple(text: str) -> tuple[int, ...]:
    """The first three numbers of a version text: `"15.1"` -> (15, 1)."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def sm_admits(need_cc: str | int, capability: tuple[int, int]) -> bool:
    """Whether a device of `capability` meets the need `sm_<need_cc>` (chapters 5 and 6).

    Up to Hopper a need is a floor: `sm_89` (FP8) and `sm_90` are met by every later GPU. From Blackwell on,
    some of the book's kernels are architecture-specific (NVGEMM's tcgen05 GEMM, cuDNN's SM100 attention):
    `sm_100` is met by the sm_10x family (B200/GB200 10.0, B300 10.3) but not by sm_120 GeForce/RTX PRO cards,
    which lack them. A trailing `+` (`"100+"`) makes it a floor again, for what torch itself gates on the
    capability alone: the NVFP4 `F.scaled_mm` (torch's tests: `SM100OrLater`, capability >= 10.0) runs on
    sm_10x and sm_12x alike.
    """
    text = str(need_cc)
    floor = text.endswith("+")
    cc = int(text.rstrip("+"))
    want = (cc // 10, cc % 10)
    if capability < want:
        return False
    return floor or want[0] < 10 or capability[0] == want[0]
