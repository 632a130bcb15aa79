"""pt215.cpu_kernels.kernel_value: the '≈' marker the sanitizer masks, and the tolerance that still fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

from pt215.cpu_kernels import AVX2_ONLY, MARK, active_capability, kernel_value

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_value_prints_the_reference_digits_with_the_mark():
    assert kernel_value(1.34794) == "≈1.3479"
    assert kernel_value(0.02614, ".2f", percent=True) == "≈2.61 %"
    assert kernel_value(1.5, ".1f", expected=1.52, tol=0.15) == "≈1.5"


def test_a_value_outside_its_tolerance_fails_with_its_name():
    with pytest.raises(AssertionError, match=r"bf16 ce = 1\.5 is outside the expected 1\.35 ± 0\.03"):
        kernel_value(1.5, expected=1.35, tol=0.03, name="bf16 ce")


@pytest.mark.parametrize("kwargs, message", [
    ({"value": float("nan")}, "value must be a finite number"),
    ({"value": True}, "value must be a finite number"),
    ({"value": 1.0, "expected": 1.0}, "give expected and tol together"),
    ({"value": 1.0, "expected": 1.0, "tol": -1}, "tol must be >= 0"),
    ({"value": 1.0, "fmt": "d"}, "is not a float format spec"),
])
def test_bad_input_names_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kernel_value(**kwargs)


def _sanitize(text: str) -> str:
    """What nbval does with tests/sanitize.cfg (its own reader, not configparser)."""
    for regex, replace in get_sanitize_patterns((ROOT / "tests/sanitize.cfg").read_text(encoding="utf-8")):
        text = re.sub(regex, replace, text)
    return text


def test_the_sanitizer_masks_every_marked_value_and_nothing_else():
    a = f"ce {kernel_value(1.3479)} flips {kernel_value(0.0261, '.2f', percent=True)} step 0 4.35"
    b = f"ce {kernel_value(1.3512)} flips {kernel_value(0.0198, '.2f', percent=True)} step 0 4.35"
    assert a != b and _sanitize(a) == _sanitize(b) == "ce ≈KERNEL flips ≈KERNEL step 0 4.35"
    assert _sanitize("step 0 4.35") != _sanitize("step 0 4.36")  # unmarked digits are still compared
    assert MARK == "≈"


def test_avx2_only_names_all_three_libraries_and_capability_is_known():
    assert set(AVX2_ONLY) == {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"}
    assert active_capability()


# The cells whose last digits depend on the CPU's matmul kernels (pt215.cpu_kernels): the main run executes
# them with this machine's own kernels; this runs them again restricted to AVX2, against the same stored digits.
CPU_SENSITIVE = ["chapters/03-nixl-transfers/03-2-kv-migration.ipynb",
                 "chapters/04-fsdp2-precision/04-1-precision-overrides.ipynb",
                 "chapters/05-nvfp4-decoding/05-2-quality.ipynb",  # W4A4 rounds activations: the last bits matter
                 "chapters/06-fp8-mps/06-1-fp8-scaled-mm.ipynb",
                 "chapters/06-fp8-mps/06-2-moe-decode-streams.ipynb",
                 "chapters/11-capstone/11-2-ab.ipynb"]


@pytest.mark.slow
@pytest.mark.skipif(active_capability() == "AVX2" or os.uname().machine != "x86_64",
                    reason="this machine's own kernels are AVX2 already: the main run covers it")
def test_cpu_sensitive_notebooks_hold_with_avx2_kernels():
    env = {**os.environ, **AVX2_ONLY}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--no-header", "-n", "0", *CPU_SENSITIVE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:]
