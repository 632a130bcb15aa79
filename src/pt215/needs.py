"""The vocabulary of hardware needs, without torch: what `pt215.hardware.requires` accepts and how it says them.

A need is `cuda`, `cuda>=N` (N GPUs), `sm_NN` (a compute capability; see `sm_admits`), `mps`, `macos>=N`,
`nixl`, `torchao`, `nccl` or `free-threaded` (a Python without the GIL). Used by `pt215.hardware` (the gates,
chapter 0), `pt215.gated_paths` (the paths `python -m pt215.verify` runs) and the website's hardware-runs lists,
which must not import torch.
"""

from __future__ import annotations

import re

__all__ = ["NEED", "VOCABULARY", "parse_need", "describe_need", "sm_admits", "version_tuple"]

NEED = re.compile(r"^(cuda(?:>=(\d+))?|sm_(\d+)|mps|macos>=(\d+(?:\.\d+)?)|nixl|torchao|nccl|free-threaded)$")
VOCABULARY = ("'cuda', 'cuda>=N', 'sm_NN' (e.g. 'sm_90', 'sm_100'), 'mps', 'macos>=N', 'nixl', 'torchao', 'nccl', "
              "'free-threaded'")


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
        cc = int(m.group(3))
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
        return "a free-threaded Python (3.13t or later, GIL disabled)"
    return f"the `{need}` package"


def version_tuple(text: str) -> tuple[int, ...]:
    """The first three numbers of a version text: `"15.1"` -> (15, 1)."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def sm_admits(need_cc: str | int, capability: tuple[int, int]) -> bool:
    """Whether a device of `capability` meets the need `sm_<need_cc>` (chapters 5 and 6).

    Up to Hopper a need is a floor: `sm_89` (FP8) and `sm_90` are met by every later GPU. From Blackwell on,
    the book's kernels are architecture-specific (tcgen05 GEMMs, cuDNN's SM100 attention): `sm_100` is met by
    the sm_10x family (B200/GB200 10.0, B300 10.3) but not by sm_120 GeForce/RTX PRO cards, which lack them.
    """
    cc = int(need_cc)
    want = (cc // 10, cc % 10)
    if capability < want:
        return False
    return want[0] < 10 or capability[0] == want[0]
