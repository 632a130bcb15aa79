"""pt215.native (chapter 9): the C++ standard in build files, TORCH_TARGET_VERSION values, header syntax checks."""

from __future__ import annotations

import shutil

import pytest

from pt215.native import cxx_standard_problems, syntax_check, torch_target_version


@pytest.mark.parametrize("text, found", [
    ("set(CMAKE_CXX_STANDARD 17)", ["CMAKE_CXX_STANDARD 17"]),
    ('set(CMAKE_CXX_STANDARD "14")', ["CMAKE_CXX_STANDARD 14"]),
    ("set_target_properties(x PROPERTIES CXX_STANDARD 17)", ["CXX_STANDARD 17 target property"]),
    ("target_compile_features(x PRIVATE cxx_std_17)", ["cxx_std_17"]),
    ('extra_compile_args={"cxx": ["-O3", "-std=c++17"]}', ["-std=c++17 flag"]),
    ("CXXFLAGS += -std=gnu++14", ["-std=gnu++14 flag"]),
    ("CXXFLAGS += -std=c++1z", ["-std=c++1z flag"]),
    ('cl /std:c++17 ops.cpp', ["MSVC /std:c++17 flag"]),
    ("CXXFLAGS = -std=c++98", ["-std=c++98 flag"]),
])
def test_old_standards_are_found(text, found):
    problems = cxx_standard_problems(text)
    assert len(problems) == len(found)
    for problem, what in zip(problems, found, strict=True):
        assert problem.startswith("line 1: ") and what in problem and "C++20" in problem


@pytest.mark.parametrize("text", [
    "set(CMAKE_CXX_STANDARD 20)", "target_compile_features(x PRIVATE cxx_std_23)", "-std=c++2a", "-std=gnu++20",
    "/std:c++20", "# set(CMAKE_CXX_STANDARD 17) in a comment", "// -std=c++17 in a C++ comment", "",
])
def test_cxx20_and_later_and_comments_pass(text):
    assert cxx_standard_problems(text) == []


def test_line_numbers_and_bad_input():
    assert cxx_standard_problems("project(x)\n\nset(CMAKE_CXX_STANDARD 17)\n")[0].startswith("line 3: ")
    with pytest.raises(ValueError, match="build_file_text"):
        cxx_standard_problems(b"set(CMAKE_CXX_STANDARD 17)")


def test_torch_target_version_packs_like_the_headers():
    assert torch_target_version(2, 15) == "0x020F000000000000"
    assert torch_target_version(2, 9) == "0x0209000000000000"
    assert torch_target_version(2, 10, 1) == "0x020A010000000000"
    for bad in ((2, 256), (2, -1), (2, 1.5), (True, 1)):
        with pytest.raises(ValueError, match="must be an integer 0-255"):
            torch_target_version(*bad)


def test_syntax_check_rejects_bad_arguments():
    with pytest.raises(ValueError, match="code"):
        syntax_check("   ")
    with pytest.raises(ValueError, match="std"):
        syntax_check("int x;", std="c20")


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler")
def test_target_version_newer_than_headers_fails_to_compile():
    code = "#include <torch/csrc/stable/version.h>\nint main() { return 0; }\n"
    newer = syntax_check(code, defines=[f"TORCH_TARGET_VERSION={torch_target_version(2, 16)}"])
    assert not newer.ok and "TORCH_TARGET_VERSION is newer than the libtorch headers" in newer.first_error
    assert newer.first_error.startswith("torch/csrc/stable/version.h:")  # relative to the include dir
    assert syntax_check(code, defines=[f"TORCH_TARGET_VERSION={torch_target_version(2, 10)}"]).ok
