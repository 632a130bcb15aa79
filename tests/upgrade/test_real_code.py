"""`python -m pt215.upgrade` on shapes seen in public training code bases (chapter 7, the measured run).

Each fixture reproduces, in a few lines written here, a kind of false finding or miss seen when the scanner ran on
eight public code bases (`data/07-upgrading/`): the noise and the wrong findings must stay silent or informational,
the missed spots must be found. Severity is what a team must do: only error and warning findings fail a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pt215.upgrade import scan_paths, scan_text
from pt215.upgrade.rules import FAILING


def codes(src: str, name: str) -> list[str]:
    return sorted(f.code for f in scan_text(src, name))


def failing(src: str, name: str) -> list[str]:
    return sorted(f.code for f in scan_text(src, name) if f.severity in FAILING)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def found(root: Path, code: str | None = None) -> list[tuple[str, int, str]]:
    findings, _, _ = scan_paths([root])
    return sorted((Path(f.path).relative_to(root).as_posix(), f.line, f.code) for f in findings
                  if (code is None or f.code == code) and f.severity in FAILING)


# ---------------------------------------------------------------- names by import origin (kept from the first run)

SILENT = [
    ("kernels.py", "from myproj.kernels import linear_cross_entropy\nloss = linear_cross_entropy(h, w, y)\n"
                   "deps = ['torch==2.9.1']\n"),
    ("sampler.py", "class Sampler:\n    def _reconfigure(self):\n        pass\n\nREQ = 'torch==2.6.0'\n"),
    ("launch.py", "import os\nos.environ['TORCH_FR_BUFFER_SIZE'] = '2000'\nbackend = 'nccl2'\nr = 'torch==2.8.0'\n"),
    ("policy.py", "from myproj.fsdp import MixedPrecisionPolicy\np = MixedPrecisionPolicy(param_dtype='bf16')\n"),
    ("fsdp.py", "import torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy\n"
                "p = MixedPrecisionPolicy(param_dtype=torch.float32)\n"),
    ("hf.py", "import torch.distributed.checkpoint as dcp\nfrom torch.distributed.checkpoint import "
              "HuggingFaceStorageWriter\ndef save(sd, path):\n    writer = HuggingFaceStorageWriter(path=path)\n"
              "    dcp.save(sd, storage_writer=writer)\n"),
    ("ckpt.py", "import torch.distributed.checkpoint as dcp\ndef round_trip(tmp_path, a, b):\n"
                "    dcp.save(a, checkpoint_id=tmp_path)\n    dcp.load(b, checkpoint_id=tmp_path)\n"),
    ("np.py", "import numpy as np\nnp.save('x.npy', a)\n"),
    ("env.sh", "export TORCH_FR_DUMP_ON_TIMEOUT=1\nexport TORCH_NCCL_DUMP_ON_TIMEOUT=1  # rollback to nccl-legacy\n"),
    ("Dockerfile", "RUN sed -i '/nvidia-cudnn-cu12/d' /usr/lib/python3.12/site-packages/torch.dist-info/METADATA\n"),
    ("init.py", "import torch\nimport torch.distributed as dist\n"
                "dist.init_process_group('nccl', device_id=torch.device('cuda', 0))\ndist.init_process_group(b)\n"),
]


@pytest.mark.parametrize(("name", "src"), SILENT, ids=[s[0] for s in SILENT])
def test_silent(name, src):
    assert codes(src, name) == [], scan_text(src, name)


def test_a_215_api_through_torch_next_to_a_lower_pin():
    src = ("from torch.distributed.fsdp import MixedPrecisionPolicy\n"
           "p = MixedPrecisionPolicy(param_dtype=None, param_dtype_override_fn=f)\n"
           "requirements = ['torch>=2.4,<2.15']\n")
    assert codes(src, "setup.py") == ["PT1509"]


@pytest.mark.parametrize("api", [
    "import torch.nn.functional as F\nloss = F.linear_cross_entropy(h, w, y)\n",  # in torch 2.13 already
    "import torch.distributed as dist\ndist.init_process_group('gloo', enable_reconfigure=True)\n",  # 2.14
    "import torch.distributed as dist\nh = dist._get_reconfigure_handle()\n",  # 2.14
])
def test_apis_older_releases_have_are_no_reason_to_pin_215(api):
    assert codes(api + "requirements = ['torch>=2.4,<2.15']\n", "setup.py") == []


# ---------------------------------------------------------------- severity that means action

def test_ignored_variable_is_info():
    """PT1514: TORCH_NCCL_AVOID_RECORD_STREAMS=0/1 is ignored by 2.15 (and did nothing to fix): information."""
    for name, src in (("launch.sh", "export TORCH_NCCL_AVOID_RECORD_STREAMS=1\n"),
                      ("model_config.yaml", "ENV_VARS:\n  TORCH_NCCL_AVOID_RECORD_STREAMS: 0\n")):
        (f,) = scan_text(src, name)
        assert (f.code, f.severity) == ("PT1514", "info")


def test_a_warning_filter_pattern_is_not_a_use_of_the_variable():
    src = ("import warnings\nwarnings.filterwarnings(\n    action='ignore',\n"
           "    message='TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect .*',\n)\n")
    assert scan_text(src, "utils.py") == []


def test_legacy_recorder_name_is_info_and_names_what_the_legacy_backend_reads():
    (f,) = scan_text("DUMP_ON_TIMEOUT = 'TORCH_NCCL_DUMP_ON_TIMEOUT'\n", "utils.py")
    assert (f.code, f.severity) == ("PT1501", "info")
    assert "legacy ProcessGroupNCCL reads only that name" in f.fix and "TORCH_FR_DUMP_ON_TIMEOUT" in f.fix


def test_nccl2_switch_by_value():
    assert failing("export TORCH_DIST_USE_NCCL2=0\n", "run.sh") == ["PT1503"]
    assert codes("export TORCH_DIST_USE_NCCL2=1\n", "run.sh") == ["PT1517"]  # 2.14's opt-in is 2.15's default
    assert failing("import os\nos.environ['TORCH_DIST_USE_NCCL2'] = '1'\n", "env.py") == []
    assert failing("import os\nos.environ['TORCH_DIST_USE_NCCL2'] = '0'\n", "env.py") == ["PT1503"]
    assert failing("env:\n  - name: TORCH_DIST_USE_NCCL2\n    value: \"0\"\n", "pod.yaml") == ["PT1503"]


def test_an_apt_nccl_is_a_check_of_which_torch_loads_it():
    """The pip wheel does not load a system NCCL; a torch built from source (an NGC base image, as Megatron-LM's CI
    image, which syncs with --no-install-package torch) loads exactly that one: a check, so a warning."""
    (f,) = scan_text("RUN apt-get install -y libnccl2=2.27.3-1+cuda12.2 libcusparselt0\n", "Dockerfile")
    assert (f.code, f.severity) == ("PT1518", "warning") and "RPATH" in f.fix and "built from source" in f.fix
    (r,) = scan_text("RUN apt-get install -y libnccl2=2.18.1-1+cuda12.2\n", "docker/torch2.6-cu124/Dockerfile")
    assert (r.code, r.severity) == ("PT1519", "info"), "in a recipe for an older stack it is information"


def test_pip_nccl_and_cudnn_messages_say_what_happens():
    nccl = [f for f in scan_text("pip install nvidia-nccl-cu12==2.27.3\n", "setup.sh") if f.code == "PT1513"]
    assert len(nccl) == 1 and "nvidia/nccl/lib/libnccl.so.2" in nccl[0].fix and "installs both" in nccl[0].fix
    assert "cannot install both" not in nccl[0].fix
    cudnn = [f for f in scan_text("pip install nvidia-cudnn-cu12==9.10.2.21\n", "setup.sh") if f.code == "PT1513"]
    assert len(cudnn) == 1 and "nvidia/cudnn/lib" in cudnn[0].fix


# ---------------------------------------------------------------- PT1507: where the metadata is written

def test_a_writer_subclass_whose_finish_pickles_metadata():
    src = ("import pickle\nfrom torch.distributed.checkpoint import FileSystemWriter\n"
           "from torch.distributed.checkpoint.metadata import Metadata\n\n"
           "class AsyncWriter(FileSystemWriter):\n    def finish(self, metadata: Metadata, results) -> None:\n"
           "        with open(self.path, 'wb') as fh:\n            pickle.dump(metadata, fh)\n")
    (f,) = scan_text(src, "filesystem_async.py")
    assert (f.code, f.line) == ("PT1507", 8) and "AsyncWriter.finish" in f.message


def test_a_storage_writer_subclass_passed_to_save():
    src = ("import pickle\nimport torch.distributed.checkpoint as dist_cp\n\n"
           "class RemoteWriter(dist_cp.StorageWriter):\n    def finish(self, metadata, results):\n"
           "        pickle.dump(metadata, self.stream)\n\n"
           "def save(d, sd):\n    dist_cp.state_dict_saver.save(sd, storage_writer=RemoteWriter(d))\n")
    got = [(f.line, f.code) for f in scan_text(src, "checkpoint.py")]
    assert got == [(6, "PT1507"), (9, "PT1507")]
    assert "RemoteWriter" in scan_text(src, "checkpoint.py")[1].message


def test_a_direct_pickle_of_checkpoint_metadata_and_the_private_save():
    src = ("import pickle\nfrom torch.distributed.checkpoint.state_dict_saver import _save_state_dict\n"
           "def rewrite(metadata, f):\n    pickle.dump(metadata, f)\n"
           "def convert(sd, writer):\n    _save_state_dict(state_dict=sd, storage_writer=writer)\n")
    assert [(f.line, f.code) for f in scan_text(src, "tools/inspector.py")] == [(4, "PT1507"), (6, "PT1507")]


def test_the_writer_is_looked_up_in_its_own_function():
    src = ("import torch.distributed.checkpoint as dcp\nfrom torch.distributed.checkpoint import "
           "FileSystemWriter, HuggingFaceStorageWriter\n"
           "def export(sd, p):\n    writer = HuggingFaceStorageWriter(path=p)\n"
           "    dcp.save(sd, storage_writer=writer)\n"
           "def train(sd, p):\n    writer = FileSystemWriter(p)\n    dcp.save(sd, storage_writer=writer)\n")
    (f,) = scan_text(src, "ckpt.py")
    assert f.line == 8 and "through FileSystemWriter" in f.message


def test_round_trips_across_a_test_module_are_silent():
    src = ("import torch.distributed.checkpoint as dcp\n\ndef _write(tmp, sd):\n"
           "    dcp.save(sd, checkpoint_id=tmp)\n\ndef test_resume(tmp_path):\n    _write(tmp_path, {})\n"
           "    dcp.load({}, checkpoint_id=tmp_path)\n\ndef test_shapes(tmp_path):\n    _write(tmp_path, {})\n")
    assert scan_text(src, "tests/unit_tests/test_checkpoint.py") == []
    assert codes(src, "train/checkpoint.py") == ["PT1507"], "outside a test module the save is reported"


def test_a_conversion_that_reads_hf_and_writes_dcp_is_not_a_round_trip():
    src = ("import torch.distributed.checkpoint as dcp\nfrom torch.distributed.checkpoint import "
           "HuggingFaceStorageReader\ndef convert(i, o, sd):\n"
           "    dcp.load(sd, storage_reader=HuggingFaceStorageReader(path=i))\n    dcp.save(sd, checkpoint_id=o)\n")
    assert [(f.line, f.code) for f in scan_text(src, "convert_from_hf.py")] == [(5, "PT1507")]


# ---------------------------------------------------------------- PT1512: variables, build args, images

def test_a_wheel_index_built_from_a_build_arg():
    src = ("ARG CUDA_VERSION_PATH=cu128\nFROM ubuntu:22.04\nARG CUDA_VERSION_PATH\n"
           "RUN pip install --index-url https://download.pytorch.org/whl/${CUDA_VERSION_PATH}/ torch\n")
    assert [(f.line, f.code) for f in scan_text(src, "Dockerfile")] == [(4, "PT1512")]


def test_a_cuda_12_devel_base_image_on_which_extensions_are_built():
    src = ("ARG CUDA_VERSION=12.8.1\nARG DEVEL=nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu22.04\n"
           "FROM ${DEVEL} AS build\nRUN pip install torch\n"
           "RUN pip install --no-build-isolation flash-attn==2.8.2\n")
    assert [(f.line, f.code) for f in scan_text(src, "Dockerfile")] == [(3, "PT1512")]
    runtime = "FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04\nRUN pip install torch\n"
    assert scan_text(runtime, "Dockerfile") == [], "a runtime image builds nothing against torch"


def test_default_launch_images_in_python_naming_an_old_pair():
    src = ('_DEFAULT_TORCH = "2.9.1".replace(".", "")\n_DEFAULT_CUDA = "12.8".replace(".", "")\n'
           "class Image:\n    stable = f\"team/core-tch{_DEFAULT_TORCH}cu{_DEFAULT_CUDA}-2025-11-25\"\n"
           "    tch270_cu128 = \"team/core-tch270cu128-2025-05-16\"\n"
           "IMAGE = 'pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime'\n")
    got = [(f.line, f.code, f.severity) for f in scan_text(src, "launch/beaker.py")]
    assert got == [(4, "PT1512", "warning"), (5, "PT1519", "info"), (6, "PT1512", "warning")]


def test_an_error_message_naming_a_cu12_package_is_not_a_pin():
    src = 'msg = f"Installed nvidia-nvshmem-cu12=={version} is older than required"\n'
    assert scan_text(src, "gpu_resource_manager.py") == []


def test_a_recipe_for_an_older_stack_is_info():
    src = "FROM team/base:cu124-torch2.6\nRUN pip install nvidia-cudnn-cu12==9.8.0.87\n"
    findings = scan_text(src, "docker/verl0.4-cu124-torch2.6-fa2.7.4/Dockerfile.app")
    assert findings and {f.code for f in findings} == {"PT1519"}


# ---------------------------------------------------------------- PT1508 per job

BOT = ("name: oncall\non: schedule\njobs:\n  rotate:\n    runs-on: ubuntu-latest\n    steps:\n"
       "      - uses: actions/setup-python@v5\n        with:\n          python-version: '3.10'\n"
       "      - run: |\n          pip install uv\n          uv sync\n          python .github/scripts/rotate.py\n")


def test_a_bot_on_310_whose_uv_sync_follows_requires_python(tmp_path):
    tree(tmp_path, {"pyproject.toml": '[project]\nname = "x"\nrequires-python = ">=3.12"\n',
                    ".github/workflows/oncall.yml": BOT})
    assert found(tmp_path) == []
    tree(tmp_path, {"pyproject.toml": '[project]\nname = "x"\nrequires-python = ">=3.10"\n'})
    assert found(tmp_path, "PT1508") == [(".github/workflows/oncall.yml", 9, "PT1508"),
                                         ("pyproject.toml", 3, "PT1508")]


def test_a_gitlab_job_that_installs_only_its_tools(tmp_path):
    tree(tmp_path, {".gitlab-ci.yml": "wait:\n  image: python:3.10\n  script:\n"
                                      "    - pip install --no-cache-dir python-gitlab click\n"
                                      "    - python wait.py\n"
                                      "imports:\n  image: python:3.10\n  script:\n"
                                      "    - python -m pip install --no-cache-dir -e .\n    - python check.py\n"})
    assert found(tmp_path) == [(".gitlab-ci.yml", 7, "PT1508")]


@pytest.mark.parametrize("steps", [
    "      - run: pip install -e .[quality]\n      - run: make quality\n",
    "      - run: pip install -e .\n      - run: mypy src\n",
    "      - run: pip install pre-commit\n      - run: pre-commit run --all-files\n",
])
def test_lint_and_type_check_jobs_on_310(tmp_path, steps):
    tree(tmp_path, {".github/workflows/q.yml": "jobs:\n  q:\n    runs-on: ubuntu-latest\n    steps:\n"
                                               "      - uses: actions/setup-python@v5\n        with:\n"
                                               "          python-version: '3.10'\n" + steps})
    assert found(tmp_path) == []


def test_a_matrix_entry_that_pins_an_older_torch(tmp_path):
    tree(tmp_path, {".github/workflows/t.yml": "jobs:\n  t:\n    strategy:\n      matrix:\n        include:\n"
                                               "          - {python-version: '3.10', pytorch-version: '2.1'}\n"
                                               "          - {python-version: '3.10', pytorch-version: 'latest'}\n"
                                               "    steps:\n"
                                               "      - run: pip install torch==${{ matrix.pytorch-version }}\n"
                                               "      - run: pytest\n"})
    assert found(tmp_path) == [(".github/workflows/t.yml", 7, "PT1508")]


def test_a_composite_action_that_installs_torch(tmp_path):
    tree(tmp_path, {
        ".github/actions/setup-env/action.yml": "runs:\n  using: composite\n  steps:\n    - shell: bash\n"
                                                "      run: uv pip install torch==${{ inputs.torch-version }}\n",
        ".github/workflows/main.yml": "jobs:\n  checks:\n    strategy:\n      matrix:\n        python: ['3.11']\n"
                                      "        include:\n          - python: '3.10'\n"
                                      "            task: {name: Lint (min Python), run: make lint-check}\n"
                                      "    steps:\n      - uses: ./.github/actions/setup-env\n        with:\n"
                                      "          python-version: ${{ matrix.python }}\n"
                                      "      - run: ${{ matrix.task.run }}\n"})
    assert found(tmp_path) == [(".github/workflows/main.yml", 7, "PT1508")]


def test_readthedocs_on_310_that_installs_the_project(tmp_path):
    tree(tmp_path, {"pyproject.toml": '[project]\nname = "x"\ndependencies = ["torch>=2.6"]\n',
                    ".readthedocs.yaml": "version: 2\nbuild:\n  os: ubuntu-22.04\n  tools:\n    python: \"3.10\"\n"
                                         "python:\n  install:\n    - method: pip\n      path: .\n"})
    assert found(tmp_path) == [(".readthedocs.yaml", 5, "PT1508")]


def test_hidden_ci_folders_of_other_systems_are_walked(tmp_path):
    tree(tmp_path, {".lightning/workflows/gpu.yml": "image: \"nvidia/cuda:12.6.3-devel-ubuntu22.04\"\n"
                                                    "parametrize:\n  include:\n    - python_version: \"3.12\"\n"
                                                    "run: |\n  uv pip install -e . --find-links whl/${BACKEND}\n"
                                                    "  pytest tests\n",
                    ".git/hooks/pre-commit.sh": "export TORCH_DIST_USE_NCCL2=0\n"})
    assert found(tmp_path) == [(".lightning/workflows/gpu.yml", 1, "PT1512")]


def test_python_requires_as_a_dict_key():
    src = 'setup_kwargs = {\n    "name": "pkg",\n    "python_requires": ">=3.10",\n}\n'
    assert [(f.line, f.code) for f in scan_text(src, "src/pkg/__setup__.py")] == [(3, "PT1508")]


# ---------------------------------------------------------------- PT1516: only where torch's headers are compiled

def test_cxx17_outside_torch_extensions_is_silent():
    pybind = ("from pybind11.setup_helpers import Pybind11Extension\n"
              "ext = Pybind11Extension('helpers', ['helpers.cpp'], extra_compile_args=['-O3', '-std=c++17'])\n")
    cupy = "import cupy\nk = cupy.RawModule(code=src, options=('-std=c++11',))\n"
    assert scan_text(pybind, "setup.py") == [] and scan_text(cupy, "kernel_launcher.py") == []


def test_cxx17_given_to_cpp_extension_through_a_variable():
    src = ("from torch.utils.cpp_extension import CUDAExtension, load\n"
           "flags = {'cxx': ['-O3'], 'nvcc': ['-O3', '-std=c++17']}\n"
           "ext = CUDAExtension('ops', ['ops.cu'], extra_compile_args=flags)\n"
           "mod = load('jit', ['a.cpp'], extra_cflags=['-std=gnu++17'])\n")
    got = [(f.line, f.code, f.severity) for f in scan_text(src, "setup.py")]
    assert got == [(2, "PT1516", "error"), (4, "PT1516", "error")]
    assert "only when no -std is given" in scan_text(src, "setup.py")[0].fix


def test_cxx17_in_the_nvcc_flags_of_load_is_named_for_what_load_does():
    """`load()` puts extra_cflags after its own -std=c++20 (the last wins) but adds -std=c++20 to nvcc's flags only
    when extra_cuda_cflags hold none (cpp_extension.py, _write_ninja_file_to_build_library): two mechanisms,
    one result."""
    src = ("from torch.utils.cpp_extension import load\n"
           "mod = load('jit', ['a.cu'], extra_cflags=['-std=c++17'], extra_cuda_cflags=['-std=c++17'])\n")
    fixes = sorted(f.fix for f in scan_text(src, "build.py"))
    assert len(fixes) == 2 and "the last -std wins" in fixes[1] and "only when extra_cuda_cflags hold no" in fixes[0]


def test_notebook_cells_are_scanned_with_cell_and_line():
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["TORCH_NCCL_TRACE_BUFFER_SIZE in prose is not a setting\n"]},
        {"cell_type": "code",
         "source": ["!pip install torch==2.14.0 --index-url https://download.pytorch.org/whl/cu126\n"]},
        {"cell_type": "code",
         "source": ["import torch.distributed as dist\n", "\n", "dist.init_process_group('nccl')\n"]},
        {"cell_type": "code", "source": ["%%bash\n", "export TORCH_DIST_USE_NCCL2=0\n"]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    got = scan_text(json.dumps(nb), "tutorial.ipynb")
    assert [(f.cell, f.line, f.code) for f in got] == [(2, 1, "PT1512"), (3, 3, "PT1515"), (4, 2, "PT1503")]
    assert got[1].where() == "tutorial.ipynb:cell 3:3"


def test_a_large_data_file_is_read_in_one_pass(tmp_path):
    """Golden values: megabytes of numbers. The scan costs one regular-expression pass over the text."""
    from pt215.timing import Stopwatch

    golden = tmp_path / "golden_values.json"
    values = {str(i): round(10.0 - i * 1e-5, 5) for i in range(1, 100_000, 1)}  # Megatron's layout: a line each
    golden.write_text(json.dumps({"lm loss": {"start_step": 1, "values": values}}, indent=4))
    with Stopwatch() as sw:
        findings, n, notes = scan_paths([golden])
    assert (findings, n, notes) == ([], 1, [])
    assert sw.seconds < 5, "a 3 MB data file must not take seconds (it took about 10 s before)"
