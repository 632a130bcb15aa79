"""`python -m pt215.upgrade` on realistic jobs, bad input, and the checklist's environment checks (chapter 7)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pt215 import upgrade
from pt215.upgrade import admits, main, scan_paths, scan_text
from pt215.upgrade.environment import (
    VERDICTS,
    Check,
    check_driver,
    check_fr_buffer,
    check_fr_env,
    check_macos_mps,
    check_nccl2_env,
    check_nccl_backend,
    check_nccl_version,
    check_python,
    check_rccl_version,
    check_target_version,
    check_torch,
    check_weights_only_env,
    check_wheel,
    environment_checks,
    probe_headers_abi,
)

JOBS = Path(__file__).resolve().parent / "jobs"
EXPECT = re.compile(r"expect:\s*(PT\d{4}(?:\s*,\s*PT\d{4})*)")


def expected(job: Path) -> set[tuple[str, int, str]]:
    out = set()
    for f in sorted(p for p in job.rglob("*") if p.is_file()):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = EXPECT.search(line)
            if m:
                out |= {(f.relative_to(job).as_posix(), n, c.strip()) for c in m.group(1).split(",")}
    return out


def codes(findings) -> list[str]:
    return [f.code for f in findings]


# ---------------------------------------------------------------- the example jobs


def test_old_job_every_expected_finding_and_nothing_else():
    findings, n_files, notes = scan_paths([JOBS / "moe_job"])
    got = {(Path(f.path).relative_to(JOBS / "moe_job").as_posix(), f.line, f.code) for f in findings}
    assert got == expected(JOBS / "moe_job")
    assert n_files == 9 and notes == [], "the walk enters .github/ (CI), reads Dockerfile, runtime_env.yaml, Makefile"
    assert set(codes(findings)) == set(upgrade.RULES), "the old job exercises every code"


def test_clean_job_has_no_findings(capsys):
    assert main([str(JOBS / "clean_job")]) == 0
    assert capsys.readouterr().out == "No findings in 4 files scanned.\n"


def test_text_output_is_linter_lines(capsys):
    assert main([str(JOBS / "moe_job" / "launch.slurm")]) == 1
    lines = capsys.readouterr().out.splitlines()
    # the pin needs a 2.15-only API in the same scan; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is informational
    assert lines[-1] == "Found 4 findings (3 informational) in 1 file scanned."
    for line in lines[:-1]:
        assert re.match(r"^.+launch\.slurm:\d+: PT15\d\d \[(error|warning|info)\] .+ \(book: chapter \d, .+\)$",
                        line), line


def test_json_output(capsys):
    assert main(["--format", "json", str(JOBS / "moe_job")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["files_scanned"] == 9
    assert len(data["findings"]) == len(expected(JOBS / "moe_job"))
    first = data["findings"][0]
    assert set(first) == {"path", "line", "code", "message", "fix", "section", "label", "severity", "cell"}


def test_the_scanner_never_writes(tmp_path):
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in JOBS.rglob("*") if p.is_file()}
    listing = sorted(JOBS.rglob("*"))
    assert main([str(JOBS), "--format", "json"]) == 1
    assert sorted(JOBS.rglob("*")) == listing
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in JOBS.rglob("*") if p.is_file()}
    assert after == before


# ---------------------------------------------------------------- bad input


def test_missing_path(capsys):
    assert main([str(JOBS / "clean_job"), "no/such/job.py"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == "pt215.upgrade: error: no/such/job.py: no such file or directory"


def test_undecodable_file_is_a_note_and_the_scan_goes_on(tmp_path, capsys):
    (tmp_path / "good.py").write_text('import os\nos.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "1"\n')
    (tmp_path / "bad.py").write_bytes(b"x = '\xff\xfe'\ncmd = 'TORCH_DIST_USE_NCCL2=0 torchrun'\n")
    assert main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "good.py:2: PT1501" in out and "bad.py:2: PT1503" in out
    assert "bad.py: not UTF-8 text (byte 0xff at offset 5); read as Latin-1" in err and err.count("\n") == 1


def test_not_a_regular_file(tmp_path, capsys):
    fifo = tmp_path / "pipe.sh"
    os.mkfifo(fifo)
    assert main([str(fifo)]) == 2
    assert "pipe.sh: not a regular file or directory" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a file without read permission")
def test_unreadable_file(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("a: 1\n")
    f.chmod(0)
    assert main([str(f)]) == 0
    assert "job.yaml: cannot read" in capsys.readouterr().err


def test_invalid_python_is_scanned_by_pattern_with_a_note(tmp_path, capsys):
    f = tmp_path / "templated.py"
    f.write_text('{% if x %}\nos.environ["TORCH_NCCL_ENABLE_FLIGHT_RECORDER"] = "1"\n')
    assert main([str(f)]) == 1
    out, err = capsys.readouterr()
    assert "templated.py:2: PT1502" in out and "not valid Python" in err


def test_walk_skips_venv_build_and_hidden_dirs(tmp_path):
    for d in (".venv", "_build", ".git", "node_modules", "src", ".github"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.sh").write_text("export TORCH_DIST_USE_NCCL2=0\n")
    findings, n, _ = scan_paths([tmp_path])
    assert n == 2 and [Path(f.path).parent.name for f in findings] == [".github", "src"]
    findings, n, _ = scan_paths([tmp_path / ".venv"])  # named explicitly: scanned
    assert n == 1


# ---------------------------------------------------------------- Python, whatever the formatting

FLAGGED = [
    ('import os\nos.environ[ "TORCH_NCCL_TRACE_BUFFER_SIZE" ]="0"\n', "PT1501"),
    ('import os\nos.environ.update({"TORCH_NCCL_TRACE_CPP_STACK": "1"})\n', "PT1501"),
    ('import os\nos.environ.update(TORCH_NCCL_DUMP_ON_TIMEOUT="1")\n', "PT1501"),
    ('def test(monkeypatch):\n    monkeypatch.setenv("TORCH_NCCL_ENABLE_FLIGHT_RECORDER", "1")\n', "PT1502"),
    ('cmd = f"TORCH_DIST_USE_NCCL2=0 torchrun {script}"\n', "PT1503"),
    ('import torch.distributed as dist\ndist.init_process_group(backend="cpu:gloo,cuda:nccl-legacy")\n', "PT1504"),
    ("from torch.distributed.fsdp import MixedPrecisionPolicy as MPP\np = MPP(\n    param_dtype=bf16,\n)\n",
     "PT1505"),
    ("import torch\np = torch.distributed.fsdp.MixedPrecisionPolicy(reduce_dtype=None, param_dtype=torch.float16)\n",
     "PT1505"),
    ('import torch\no = torch.nn.LinearCrossEntropyOptions(False, None, "auto", "balanced")\n', "PT1506"),
    ('import dataclasses\no = dataclasses.replace(opts, acc_policy="fast")\n', "PT1506"),
    ("from torch.distributed.checkpoint import save as write\nwrite(sd, checkpoint_id=p)\n", "PT1507"),
    ("from torch.distributed import checkpoint\ncheckpoint.async_save(sd, checkpoint_id=p)\n", "PT1507"),
    ("import torch.distributed.checkpoint as dcp\nfut = dcp.async_save(sd)\n", "PT1507"),
    ('from setuptools import setup\nsetup(name="x", python_requires=">=3.8")\n', "PT1508"),
    ("from torch import load\nsd = load(f,\n          weights_only=False)\n", "PT1510"),
    # any pickle_module turns the weights-only default off (serialization._default_to_weights_only)
    ("import dill\nimport torch\nsd = torch.load(f, pickle_module=dill)\n", "PT1510"),
    ("import pickle\nimport torch.serialization as ser\nsd = ser.load(f, None, pickle)\n", "PT1510"),
    ("import dill\nimport torch\nsd = torch.load(f, pickle_module=dill, weights_only=None)\n", "PT1510"),
    ('flags = ["-DTORCH_TARGET_VERSION=0x0211000000000000"]\n', "PT1511"),
]

CLEAN = [
    'import os\nos.environ["TORCH_FR_BUFFER_SIZE"] = "2000"\n',
    'import os\nos.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "0"  # noqa: PT1501\n',
    'def f():\n    """Set TORCH_NCCL_TRACE_BUFFER_SIZE=0 in the old days; nccl-legacy too."""\n',
    "import torch\np = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n",
    "p = MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16)\n",
    "p = MixedPrecisionPolicy(param_dtype=None)\n",
    "p = MixedPrecisionPolicy(param_dtype=torch.bfloat16, **kw)\n",
    "p = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=rd)\n",
    "from torch.distributed.fsdp import MixedPrecision\np = MixedPrecision(param_dtype=torch.bfloat16)\n",
    'o = LinearCrossEntropyOptions(acc_policy="compact")\n',
    "o = LinearCrossEntropyOptions(acc_policy=policy)\n",
    "import torch\nsd = torch.load(f)\nsd = torch.load(f, weights_only=True)\n",
    "import torch\nsd = torch.load(f, pickle_module=None)\nsd = torch.load(f, pickle_module=m, weights_only=True)\n",
    "import torch\nsd = torch.load(f, pickle_module=m, **kw)\n",
    "import numpy as np\nnp.save(f, a)\nsave(x)\n",
    "import torch.distributed.checkpoint as dcp\ndcp.load(sd, checkpoint_id=p)\n",
    'setup(python_requires=">=3.11")\n',
    'flags = ["-DTORCH_TARGET_VERSION=0x020f000000000000"]\n',
    'deps = ["torch==2.14.0"]\n',  # a pin below 2.15 alone is not a finding: nothing here needs 2.15
]


@pytest.mark.parametrize(("src", "code"), FLAGGED, ids=[f"{c}-{i}" for i, (_, c) in enumerate(FLAGGED)])
def test_python_pattern_is_flagged(src, code):
    assert code in codes(scan_text(src, "job.py"))


@pytest.mark.parametrize("src", CLEAN, ids=range(len(CLEAN)))
def test_correct_python_is_not_flagged(src):
    assert scan_text(src, "job.py") == []


def test_the_line_is_where_the_value_is():
    src = ('import os\nos.environ.setdefault(\n    "x",\n)\n'
           'os.environ.setdefault(\n    "TORCH_NCCL_DUMP_ON_TIMEOUT", "1")\n')
    assert [(f.line, f.code) for f in scan_text(src, "job.py")] == [(6, "PT1501")]


def test_pin_below_215_with_a_215_api_in_the_same_file():
    src = 'deps = ["torch>=2.4,<2.15"]\nfrom torch.distributed import _transport\n'
    (f,) = scan_text(src, "setup.py")
    assert (f.code, f.line) == ("PT1509", 1) and "torch.distributed._transport" in f.message


CONFIGS = [
    # a name in a config is no 2.15 API (only torch's own, reached from Python, are); +cu128 is a CUDA 12 wheel
    ("requirements.txt", "torch==2.14.0+cu128\nx = param_dtype_override_fn\n", ["PT1512"]),
    ("setup.cfg", "[options]\npython_requires = >=3.10\n", ["PT1508"]),
    ("pyproject.toml", '[tool.poetry.dependencies]\npython = "^3.10"\ntorch = "~2.14"\n'
                       "[x]\nenable_reconfigure = true\n", ["PT1508"]),
    ("environment.yml", "dependencies:\n  - python=3.10\n  - pytorch=2.14\n", ["PT1508"]),
    ("Dockerfile", "FROM python:3.10-slim\nENV TORCH_NCCL_DUMP_ON_TIMEOUT=1\nRUN pip install torch\n",
     ["PT1501", "PT1508"]),
    # a Python 3.10 image that installs no torch (a docs or tooling image): its Python never meets torch
    ("Dockerfile", "FROM python:3.10-slim\nRUN pip install mkdocs\n", []),
    ("compose.yaml", "services:\n  train:\n    environment:\n      - TORCH_DIST_USE_NCCL2=0\n", ["PT1503"]),
    ("ci.yaml", "env:\n  TORCH_NCCL_TRACE_BUFFER_SIZE: 100  # old\n", ["PT1501"]),
    ("run.sh", "python -c 'import torch; torch.load(p, weights_only=False)'\n", ["PT1510"]),
    ("run.sh", "python -c 'import torch, dill; torch.load(p, pickle_module=dill)'\n", ["PT1510"]),
    # serialization.py acts on TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD only for "1", "y", "yes", "true"
    ("run.sh", "export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=0\n", []),
    ("run.sh", "export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=true\n", ["PT1510"]),
    ("job.toml", '[fsdp]\nparam_dtype = "bf16"\nreduce_dtype = "none"\n', ["PT1505"]),
    ("job.yaml", "fsdp:\n  param_dtype: bf16\n  reduce_dtype: bf16\nacc_policy: auto\n", []),
    ("job.ini", "; TORCH_NCCL_TRACE_BUFFER_SIZE=1\n[env]\nTORCH_FR_BUFFER_SIZE = 1\n", []),
    ("pyproject.toml", '[project]\nrequires-python = ">=3.11"\ndependencies = ["torch>=2.15"]\n', []),
]


@pytest.mark.parametrize(("name", "src", "want"), CONFIGS, ids=[c[0] + f"-{i}" for i, c in enumerate(CONFIGS)])
def test_configs_by_pattern(name, src, want):
    assert sorted(codes(scan_text(src, name))) == want


@pytest.mark.parametrize(("spec", "version", "ok"), [
    (">=3.9", "3.10", True), (">=3.11", "3.10.12", False), ("~=3.10", "3.12", True), ("~=3.10.1", "3.11", False),
    ("==3.12.*", "3.12.4", True), ("!=3.10.*,>=3.9", "3.10.2", False), ("^3.10", "4.0", False),
    ("<3.11 || >=3.12", "3.11.5", False), (">=2.4,<2.15", "2.15.0", False), ("==2.14.0+cu128", "2.14.0", True),
])
def test_specifiers(spec, version, ok):
    assert admits(spec, version) is ok


def test_bad_specifier_raises():
    with pytest.raises(ValueError, match="not a version"):
        admits(">=three", "3.11")


def test_acc_policies_match_the_installed_torch():
    from torch.nn.modules import linear_cross_entropy_options as lce

    assert upgrade.ACC_POLICIES == lce._VALID_ACC_POLICIES


def test_every_rule_names_a_book_section():
    for rule in upgrade.RULES.values():
        assert re.fullmatch(r"PT15\d\d", rule.code) and rule.fix and re.match(r"chapter \d, ", rule.section)
        assert re.fullmatch(r"[a-z0-9-]+", rule.label)


def test_labels_exist_in_the_book():
    root = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for p in (root / "chapters").glob("*/index.md"))
    for rule in upgrade.RULES.values():
        assert f"({rule.label})=" in text, rule.label


# ---------------------------------------------------------------- environment checks


def test_environment_checks_on_this_machine():
    checks = environment_checks()
    assert all(isinstance(c, Check) and c.verdict in VERDICTS and c.section for c in checks)
    assert len({c.name for c in checks}) == len(checks)


@pytest.mark.parametrize(("check", "verdict"), [
    (check_python((3, 10)), "fail"), (check_python((3, 11)), "ok"), (check_python((3, 15)), "ok"),
    (check_python((3, 16)), "warn"), (check_python((3, 10, 12)), "fail"), (check_python((3, 12, 1)), "ok"),
    (check_torch("2.14.1+cu128"), "fail"), (check_torch("2.15.0+cu132"), "ok"), (check_torch("2.15.1"), "warn"),
    (check_torch("2.16.0"), "fail"), (check_torch(None, "OSError: libtorch_cpu.so", True), "fail"),
    (check_wheel("13.2", None), "ok"), (check_wheel("13.4", None), "ok"), (check_wheel("12.8", None), "warn"),
    (check_wheel(None, None), "ok"), (check_wheel(None, "7.1"), "ok"), (check_wheel(None, None, True), "ok"),
    (check_driver(None, 0), "skip"), (check_driver("13.2", 0), "skip"), (check_driver("13.2", 8, "575.57.08"), "warn"),
    (check_driver("13.2", 8, "580.95.05"), "ok"), (check_driver("13.2", 8, None), "warn"),
    (check_driver("13.2", 0, "575.57.08", (12, 9)), "warn"), (check_driver("13.2", 1, "580.95.05", (13, 4)), "ok"),
    (check_driver("13.4", 1, "580.65.06", (13, 0)), "warn"), (check_driver("13.2", 1, None, (13, 2)), "ok"),
    (check_nccl_backend({}, None), "ok"), (check_nccl_backend({"TORCH_DIST_USE_NCCL2": "0"}, None), "warn"),
    (check_nccl_backend({}, "_create_nccl_process_group"), "warn"),
    (check_nccl_backend({"TORCH_DIST_USE_NCCL2": "0"}, "_create_nccl2_process_group"), "ok"),
    (check_nccl_version((2, 26, 5), None), "warn"), (check_nccl_version((2, 30, 7), None), "ok"),
    (check_nccl_version(None, None), "skip"), (check_nccl_version((2, 30, 7), "7.1"), "skip"),
    (check_nccl_version((2, 30, 7), None, (2, 30, 7)), "ok"),
    (check_nccl_version((2, 29, 7), None, (2, 30, 7)), "warn"),  # another libnccl.so.2 than torch was built with
    (check_rccl_version(None, None), "skip"), (check_rccl_version("7.1", (2, 30, 4)), "warn"),
    (check_rccl_version("7.1", (2, 30, 7)), "ok"),
    (check_macos_mps(None), "skip"), (check_macos_mps("14.6.1"), "warn"), (check_macos_mps("15.2"), "ok"),
    (check_nccl2_env({}), "ok"), (check_nccl2_env({"TORCH_DIST_USE_NCCL2": "0"}), "warn"),
    (check_nccl2_env({"TORCH_DIST_USE_NCCL2": "1"}), "warn"),
    (check_fr_env({}), "ok"), (check_fr_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "1"}), "warn"),
    (check_fr_env({"TORCH_NCCL_ENABLE_FLIGHT_RECORDER": "1"}), "fail"),
    (check_fr_buffer({}), "ok"), (check_fr_buffer({"TORCH_FR_BUFFER_SIZE": "0"}), "warn"),
    (check_fr_buffer({"TORCH_FR_BUFFER_SIZE": "x"}), "warn"),
    (check_target_version({}, 0x020F000000000000), "ok"),
    (check_target_version({"CXXFLAGS": "-O2 -DTORCH_TARGET_VERSION=0x0209000000000000"}, 0x020F000000000000), "ok"),
    (check_target_version({"CXXFLAGS": "-DTORCH_TARGET_VERSION=0x0210000000000000"}, 0x020F000000000000), "fail"),
    (check_weights_only_env({}), "ok"), (check_weights_only_env({"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}), "warn"),
])
def test_check_verdicts(check, verdict):
    assert check.verdict == verdict, check.line()
    if verdict in ("warn", "fail"):
        assert check.fix


def test_installed_headers_abi_is_215():
    assert check_target_version({}, probe_headers_abi()).detail.endswith("0x020f000000000000)")


def test_pt1516_only_where_torch_headers_are_compiled(tmp_path):
    """PT1516: a standard below C++20 where torch's headers are compiled (chapter 9: they need C++20)."""
    from pt215.upgrade import scan_paths

    (tmp_path / "CMakeLists.txt").write_text("project(ext)\nset(CMAKE_CXX_STANDARD 17)\n"
                                              "target_compile_features(ext PRIVATE cxx_std_20)\n")  # raised: fine
    (tmp_path / "setup.py").write_text("from torch.utils.cpp_extension import CppExtension\n"
                                       "ext = CppExtension('e', ['e.cpp'], extra_compile_args=['-O2', '-std=c++17'])\n")
    (tmp_path / "Makefile").write_text("CXXFLAGS = -std=c++20 -O2\n")
    linked = tmp_path / "linked"  # find_package(Torch): its INTERFACE cxx_std_20 comes last on the compile line
    linked.mkdir()
    (linked / "CMakeLists.txt").write_text("find_package(Torch REQUIRED)\nset(CMAKE_CXX_STANDARD 17)\n"
                                           "set(CMAKE_CXX_FLAGS \"${CMAKE_CXX_FLAGS} -std=gnu++17\")\n"
                                           "set_property(TARGET x PROPERTY CXX_STANDARD 17)\n")
    ops = tmp_path / "ops"  # a Makefile whose sources include torch's headers
    ops.mkdir()
    (ops / "Makefile").write_text("CXXFLAGS = -O2 -std=c++17\nops.so: ops.cpp\n\t$(CXX) $(CXXFLAGS) -shared $<\n")
    (ops / "ops.cpp").write_text("#include <torch/extension.h>\n")
    helpers = tmp_path / "helpers"  # a pybind11-only helper: no torch header is compiled
    helpers.mkdir()
    (helpers / "Makefile").write_text("CXXFLAGS += -O3 -shared -std=c++17 -fPIC\n")
    (helpers / "helpers.cpp").write_text("#include <pybind11/pybind11.h>\n")
    findings, _n_files, _notes = scan_paths([tmp_path])
    found = sorted((Path(f.path).relative_to(tmp_path).as_posix(), f.line) for f in findings if f.code == "PT1516")
    assert found == [("ops/Makefile", 1), ("setup.py", 2)]


def test_one_table_of_legacy_recorder_names_and_one_of_rules():
    """FR_LEGACY is chapter 2's table of the settings (`pt215.flight.ENV_VARS`); RULES refuses a code twice."""
    from pt215 import flight
    from pt215.upgrade import environment, rules

    assert upgrade.FR_LEGACY is rules.FR_LEGACY is environment.FR_LEGACY
    assert environment.FR_LEGACY == {old: new for new, old, _, _ in flight.ENV_VARS if old}
    assert upgrade.RULES is rules.RULES and len(upgrade.RULES) == 20
    rule = upgrade.RULES["PT1501"]
    with pytest.raises(ValueError, match="PT1501"):
        rules._by_code([rule, rule])


@pytest.mark.parametrize(("text", "code"), [
    # NGC's PyTorch image: its torch is built against the system NCCL the apt pin installs -> a check to make
    ("FROM nvcr.io/nvidia/pytorch:25.01-py3\nRUN apt-get install -y libnccl2=2.27.3-1+cuda12.2\n", "PT1518"),
    # a shell script cannot say which torch runs it -> a check to make
    ("apt-get install -y libnccl2=2.27.3-1+cuda12.2 libnccl-dev=2.27.3-1+cuda12.2\n", "PT1518"),
    # an image on another base (verl's Isaac Lab image): its pip torch loads the wheel's NCCL -> information
    ("FROM isaac-lab-base:latest\nRUN apt-get install -y libcusparselt0 libnccl2=2.27.3-1+cuda12.2\n", "PT1520"),
    ("FROM nvidia/cuda:13.0.0-devel-ubuntu24.04\nRUN apt-get install -y libcudnn9-cuda-13=9.26.0.1-1\n", "PT1520"),
])
def test_an_apt_pin_fails_only_where_a_torch_may_load_it(text, code):
    name = "Dockerfile" if text.startswith("FROM") else "install_nccl.sh"
    found = {f.code for f in scan_text(text, name)} & {"PT1518", "PT1520"}
    assert found == {code}
    assert upgrade.RULES[code].severity == ("warning" if code == "PT1518" else "info")
