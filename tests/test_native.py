"""pt215.native (chapter 9): the C++ standard in build files, TORCH_TARGET_VERSION values, header syntax checks."""

from __future__ import annotations

import shutil

import pytest

from pt215.native import cxx_standard_problems, include_chain, syntax_check, torch_target_version


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


def test_syntax_check_rejects_a_bad_error_limit():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_errors"):
            syntax_check("int x;", max_errors=bad)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler")
def test_a_cxx17_extension_build_stops_at_the_cxx20_guard():
    r = syntax_check("#include <torch/extension.h>\nint main() { return 0; }\n", std="c++17", max_errors=1)
    assert not r.ok and r.where() == "torch/csrc/api/include/torch/all.h:9"
    assert len(r.errors) == 1 and "C++20 or later compatible compiler is required to use PyTorch" in r.first_error
    assert "/" + "site-packages" not in r.first_error  # no machine path


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler")
def test_a_snippet_that_compiles_has_no_errors():
    r = syntax_check("int main() { return 0; }\n", std="c++17")
    assert r.ok and r.errors == () and r.first_error == "" and r.where() == ""


def test_include_chain_follows_the_installed_headers():
    chain = include_chain("torch/library.h", "c10/util/Bitset.h")
    assert chain[0] == "torch/library.h" and chain[-2:] == ["ATen/core/dispatch/DispatchKeyExtractor.h",
                                                            "c10/util/Bitset.h"]
    assert include_chain("c10/util/Bitset.h", "torch/library.h") == []  # Bitset.h includes no torch/library.h
    with pytest.raises(ValueError, match="not a torch header"):
        include_chain("torch/no_such_header.h", "c10/util/Bitset.h")
