"""pt215.needs: the vocabulary of hardware needs, in words, without torch (chapter 0; the website reads it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pt215.needs import describe_need, parse_need, sm_admits, version_tuple


@pytest.mark.parametrize("need, words", [
    ("cuda", "a CUDA GPU"), ("cuda>=2", ">= 2 CUDA GPUs"), ("sm_89", "a CUDA GPU of compute capability sm_89+"),
    ("sm_100", "a CUDA GPU of the sm_10x family (sm_100+, not a later architecture)"), ("mps", "Apple MPS"),
    ("macos>=15", "macOS >= 15"), ("nccl", "NCCL with a CUDA GPU"), ("nixl", "the `nixl` package"),
    ("free-threaded", "a free-threaded Python (3.14t, GIL disabled)")])
def test_every_need_has_words(need: str, words: str):
    assert describe_need(need) == words


@pytest.mark.parametrize("bad", ["gpu", "sm90", "cuda>=", "", None, 3])
def test_an_unknown_need_is_named_with_the_vocabulary(bad):
    with pytest.raises(ValueError, match=r"unknown requirement .*expected one of: 'cuda'.*'free-threaded'"):
        parse_need(bad)


def test_sm_floors_up_to_hopper_and_families_from_blackwell():
    assert sm_admits(89, (9, 0)) and sm_admits("90", (10, 0))
    assert sm_admits(100, (10, 3)) and not sm_admits(100, (12, 0)) and not sm_admits(90, (8, 9))
    assert version_tuple("15.1.2 beta") == (15, 1, 2)


def test_the_vocabulary_imports_no_torch():
    code = "import sys, pt215.needs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_chapter_gates_parse_and_say_what_they_admit():
    from pt215.needs import GATES

    for need in GATES:
        parse_need(need)  # every gate is in the vocabulary
    assert GATES["sm_100+"] == "ch. 5: NVFP4 GEMM (capability 10.0 or later, incl. sm_120)"
    assert "NVGEMM" in GATES["sm_100"] and "sm_10x" in GATES["sm_100"]
    # the NVFP4 GEMM's floor admits sm_100, sm_103 and sm_120; NVGEMM's family admits sm_10x only
    assert all(sm_admits("100+", cc) for cc in ((10, 0), (10, 3), (12, 0)))
    assert not sm_admits("100+", (9, 0))
    assert sm_admits("100", (10, 3)) and not sm_admits("100", (12, 0))
    assert describe_need("sm_100+") == "a CUDA GPU of compute capability sm_100 or later (any architecture)"
