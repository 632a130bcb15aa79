"""Which C++ standard a build really compiles with (PT1516, `pt215.native.cxx_standard_problems`; chapters 7, 9).

CMake: a target that links an `INTERFACE cxx_std_20` library, as `find_package(Torch)`'s `torch` target is
(TorchConfig.cmake), compiles with the feature's `-std=gnu++20` *after* a `-std=c++17` given through
`CMAKE_CXX_FLAGS`, `add_compile_options` or `target_compile_options`, and the last `-std` wins: built here with the
installed cmake and g++ (TorchConfig.cmake itself needs the CUDA toolkit to configure, so the test reproduces its
one line on an INTERFACE library, and checks that the line is in the installed file). setup.py: BuildExtension
adds its own `-std=c++20` only when the user gives none, so a user's `-std=c++17` decides.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pt215.native import cxx_standard_problems

GUARD = "#if __cplusplus < 202002L\n#error compiled below C++20\n#endif\nint probe() { return 1; }\n"
HOW = {
    "flags": 'set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -std=c++17")',
    "options": "add_compile_options(-std=c++17)",
    "target": None,  # target_compile_options after the target
    "standard": "set(CMAKE_CXX_STANDARD 17)",
}
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                                 reason="needs cmake and g++")


def test_torchconfig_gives_torch_an_interface_cxx_std_20():
    import torch.utils

    cfg = Path(torch.utils.cmake_prefix_path) / "Torch" / "TorchConfig.cmake"
    assert "target_compile_features(torch INTERFACE cxx_std_20)" in cfg.read_text()


@needs_cmake
def test_the_interface_feature_comes_last_and_wins(tmp_path):
    top = ["cmake_minimum_required(VERSION 3.18)", "project(probe CXX)",
           "add_library(torch_like INTERFACE)", "target_compile_features(torch_like INTERFACE cxx_std_20)"]
    for name, line in HOW.items():
        d = tmp_path / name
        d.mkdir()
        (d / "probe.cpp").write_text(GUARD)
        body = [line] if line else []
        body += [f"add_library(probe_{name} SHARED probe.cpp)", f"target_link_libraries(probe_{name} torch_like)"]
        if line is None:
            body.append(f"target_compile_options(probe_{name} PRIVATE -std=c++17)")
        (d / "CMakeLists.txt").write_text("\n".join(body) + "\n")
        top.append(f"add_subdirectory({name})")
    (tmp_path / "CMakeLists.txt").write_text("\n".join(top) + "\n")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(build)], check=True, capture_output=True, timeout=300)
    proc = subprocess.run(["cmake", "--build", str(build), "--verbose"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # the C++20 guard compiled, all four
    for name in HOW:
        line = next(ln for ln in proc.stdout.splitlines() if f"probe_{name}" in ln and " -c " in ln)
        stds = re.findall(r"-std=\S+", line)
        assert stds[-1] == "-std=gnu++20", (name, stds)
    text = "\n".join(["find_package(Torch REQUIRED)", *[x for x in HOW.values() if x],
                      "target_compile_options(ops PRIVATE -std=c++17)"])
    assert cxx_standard_problems(text) == [], "none of these breaks a find_package(Torch) build"


needs_nvcc = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nvcc") is None,
                                reason="needs cmake and nvcc")


def test_cuda_cmake_copies_the_cxx_standard():
    """Caffe2's public/cuda.cmake, which find_package(Torch) runs in a CUDA build, sets an unset CMAKE_CUDA_STANDARD
    from CMAKE_CXX_STANDARD (the two lines the nvcc test below reproduces)."""
    import torch.utils

    cuda = (Path(torch.utils.cmake_prefix_path) / "Caffe2" / "public" / "cuda.cmake").read_text()
    assert 'if("X${CMAKE_CUDA_STANDARD}" STREQUAL "X" )\n  set(CMAKE_CUDA_STANDARD ${CMAKE_CXX_STANDARD})' in cuda


@needs_nvcc
def test_the_interface_cxx_feature_does_not_reach_cuda_sources(tmp_path):
    """`INTERFACE cxx_std_20` raises the C++ sources only: with CMAKE_CXX_STANDARD 17 copied into
    CMAKE_CUDA_STANDARD (as cuda.cmake does), nvcc gets -std=c++17 and the .cu file stops at the C++20 guard."""
    (tmp_path / "probe.cpp").write_text(GUARD)
    (tmp_path / "probe.cu").write_text(GUARD)
    (tmp_path / "CMakeLists.txt").write_text("\n".join([
        "cmake_minimum_required(VERSION 3.18)", "project(probe CXX CUDA)", "set(CMAKE_CXX_STANDARD 17)",
        'if("X${CMAKE_CUDA_STANDARD}" STREQUAL "X" )', "  set(CMAKE_CUDA_STANDARD ${CMAKE_CXX_STANDARD})", "endif()",
        "add_library(torch_like INTERFACE)", "target_compile_features(torch_like INTERFACE cxx_std_20)",
        "add_library(probe SHARED probe.cu probe.cpp)", "target_link_libraries(probe torch_like)"]) + "\n")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(build)], check=True, capture_output=True, timeout=300)
    proc = subprocess.run(["cmake", "--build", str(build), "--verbose", "-j1", "--", "-k"], capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "probe.cu:2" in out and "compiled below C++20" in out
    cu = next(ln for ln in out.splitlines() if "nvcc" in ln and "probe.cu" in ln and " -c " in ln)
    assert re.findall(r"-std=\S+", cu) == ["-std=c++17"]
    cpp = next(ln for ln in out.splitlines() if "probe.cpp" in ln and " -c " in ln and "nvcc" not in ln)
    assert re.findall(r"-std=\S+", cpp)[-1] == "-std=gnu++20"


def _build_ext(tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess:
    tmp_path.mkdir()
    (tmp_path / "probe.cpp").write_text(GUARD)
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nfrom torch.utils.cpp_extension import BuildExtension, CppExtension\n"
        f"setup(name='probe', ext_modules=[CppExtension('probe', ['probe.cpp'], extra_compile_args={flags!r})],\n"
        "      cmdclass={'build_ext': BuildExtension.with_options(use_ninja=False)})\n")
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler")
def test_build_extension_adds_cxx20_only_when_no_std_is_given(tmp_path):
    plain = _build_ext(tmp_path / "plain", [])
    assert plain.returncode == 0 and "-std=c++20" in plain.stdout, plain.stdout[-2000:] + plain.stderr[-2000:]
    old = _build_ext(tmp_path / "old", ["-std=c++17"])
    assert old.returncode != 0 and "compiled below C++20" in old.stdout + old.stderr
    compile_line = next(ln for ln in old.stdout.splitlines() if "probe.cpp" in ln and " -c " in ln)
    assert "-std=c++20" not in compile_line and "-std=c++17" in compile_line
