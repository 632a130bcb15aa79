"""`python -m pt215.upgrade` on patterns modelled on public FSDP2 code bases (chapter 7, "The scanner on real code").

Each snippet is written here to reproduce a shape seen in torchtitan, torchtune, pytorch/examples, accelerate or
verl (data/07-upgrading/ names the commits): the false positives of a name-matching scanner must stay silent,
and the pins those repositories really set must be found.
"""

from __future__ import annotations

import pytest

from pt215.upgrade import scan_text


def codes(src: str, name: str) -> list[str]:
    return sorted(f.code for f in scan_text(src, name))


# ---------------------------------------------------------------- precision: names by import origin

SILENT = [
    # a team's own fused loss that shares torch 2.15's name
    ("kernels.py", "from myproj.kernels import linear_cross_entropy\nloss = linear_cross_entropy(h, w, y)\n"
                   "deps = ['torch==2.9.1']\n"),
    ("loss.py", "from mylib.modules.loss import LinearCrossEntropyLoss\n"
                "class Loss(LinearCrossEntropyLoss):\n    pass\n\npins = 'torch>=2.4,<2.10'\n"),
    # a method called _reconfigure on some other object
    ("sampler.py", "class Sampler:\n    def _reconfigure(self):\n        pass\n\nREQ = 'torch==2.6.0'\n"),
    # the TORCH_FR_* names and nccl2 are no evidence that the code needs 2.15
    ("launch.py", "import os\nos.environ['TORCH_FR_BUFFER_SIZE'] = '2000'\nbackend = 'nccl2'\nr = 'torch==2.8.0'\n"),
    # a class of the same name that is not torch's
    ("policy.py", "from myproj.fsdp import MixedPrecisionPolicy\np = MixedPrecisionPolicy(param_dtype='bf16')\n"),
    # fp32 compute: 2.14 and 2.15 reduce in the same dtype
    ("fsdp.py", "import torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy\n"
                "p = MixedPrecisionPolicy(param_dtype=torch.float32)\n"),
    # HuggingFace writer: safetensors and a JSON index, no pickled .metadata
    ("hf.py", "import torch.distributed.checkpoint as dcp\nfrom torch.distributed.checkpoint import "
              "HuggingFaceStorageWriter\ndef save(sd, path):\n    writer = HuggingFaceStorageWriter(path=path)\n"
              "    dcp.save(sd, storage_writer=writer)\n"),
    # a save followed by a load in the same function: the reader is the same torch
    ("test_ckpt.py", "import torch.distributed.checkpoint as dcp\ndef test_round_trip(tmp_path, a, b):\n"
                     "    dcp.save(a, checkpoint_id=tmp_path)\n    dcp.load(b, checkpoint_id=tmp_path)\n"),
    # an unrelated save
    ("np.py", "import numpy as np\nnp.save('x.npy', a)\n"),
    # the new name next to the legacy one: the advice of PT1501, already followed
    ("env.sh", "export TORCH_FR_DUMP_ON_TIMEOUT=1\nexport TORCH_NCCL_DUMP_ON_TIMEOUT=1  # rollback to nccl-legacy\n"),
    # removing a CUDA 12 library from metadata is not installing one
    ("Dockerfile", "RUN sed -i '/nvidia-cudnn-cu12/d' /usr/lib/python3.12/site-packages/torch.dist-info/METADATA\n"),
    # a CI job that installs no torch: its Python version is moot
    (".github/workflows/stale.yml", "jobs:\n  s:\n    steps:\n      - uses: actions/setup-python@v5\n"
                                    "        with:\n          python-version: '3.10'\n"
                                    "      - run: pip install PyGithub\n"),
    # init_process_group with device_id, or with a backend the scanner cannot see
    ("init.py", "import torch\nimport torch.distributed as dist\n"
                "dist.init_process_group('nccl', device_id=torch.device('cuda', 0))\ndist.init_process_group(b)\n"),
]


@pytest.mark.parametrize(("name", "src"), SILENT, ids=[s[0] for s in SILENT])
def test_silent(name, src):
    assert codes(src, name) == [], scan_text(src, name)


def test_torch_weights_only_false_is_informational():
    (f,) = scan_text("import torch\nsd = torch.load(p, weights_only=False)\n", "load.py")
    assert (f.code, f.severity) == ("PT1510", "info") and "not a 2.15 change" in f.fix


def test_pt1501_keeps_the_rollback_path():
    (f,) = scan_text("DUMP_ON_TIMEOUT = 'TORCH_NCCL_DUMP_ON_TIMEOUT'\n", "utils.py")
    assert f.code == "PT1501" and "TORCH_FR_DUMP_ON_TIMEOUT" in f.fix and "nccl-legacy" in f.fix
    assert "rename" not in f.fix


def test_a_writer_that_may_be_none_is_flagged():
    src = ("import torch.distributed.checkpoint as dcp\nfrom torch.distributed.checkpoint import "
           "HuggingFaceStorageWriter\ndef save(sd, to_hf, path):\n    writer: HuggingFaceStorageWriter | None = None\n"
           "    if to_hf:\n        writer = HuggingFaceStorageWriter(path=path)\n"
           "    dcp.async_save(sd, storage_writer=writer, checkpoint_id=path)\n")
    (f,) = scan_text(src, "dcp.py")
    assert (f.code, f.line) == ("PT1507", 7)


def test_torch_2_15_api_through_torch_counts():
    src = ("import torch.nn.functional as F\nloss = F.linear_cross_entropy(h, w, y)\n"
           "requirements = ['torch>=2.4,<2.15']\n")
    assert codes(src, "setup.py") == ["PT1509"]


# ---------------------------------------------------------------- recall: where teams keep their pins

FOUND = [
    ("Dockerfile", "FROM nvidia/cuda:12.6.3-devel-ubuntu22.04\nENV PYTHON_VERSION=3.10\n"
                   "RUN conda create -n env python=${PYTHON_VERSION}\n", ["PT1508"]),
    ("Dockerfile.cpu", "FROM python:3.9-slim AS build\n", ["PT1508"]),
    ("Dockerfile.dlc", "FROM registry.example/pytorch-training:2.1.0-gpu-py310-cu121-ubuntu20.04\n", ["PT1508"]),
    ("Dockerfile.gpu", "RUN pip install torch --extra-index-url https://download.pytorch.org/whl/cu126\n", ["PT1512"]),
    ("install.sh", "pip install --no-deps nvidia-cudnn-cu12==9.10.2.21\n", ["PT1512", "PT1513"]),
    ("Dockerfile.nccl", "RUN apt-get install -y libnccl2=2.27.3-1+cuda12.2 libnccl-dev=2.27.3-1+cuda12.2\n",
     ["PT1513"]),
    ("requirements.txt", "nvidia-nccl-cu13==2.30.7\nnvidia-cudnn-cu13==9.26.0.51\ntorch==2.15.0\n", []),
    (".github/workflows/test.yml", "jobs:\n  t:\n    strategy:\n      matrix:\n"
                                   "        python-version: ['3.9', '3.10', '3.11']\n"
                                   "    steps:\n      - run: pip install -e .[dev]\n", ["PT1508"]),
    (".github/workflows/gpu.yml", "jobs:\n  t:\n    strategy:\n      matrix:\n        python-version:\n"
                                  "          - '3.10'\n          - '3.12'\n"
                                  "    steps:\n      - run: pip install torch\n",
     ["PT1508"]),
    (".gitlab-ci.yml", "test:\n  image: python:3.10\n  script:\n    - pip install torch\n", ["PT1508"]),
    ("runtime_env.yaml", "env_vars:\n  TORCH_NCCL_AVOID_RECORD_STREAMS: \"1\"\n", ["PT1514"]),
    ("rollout.py", "import os\nos.environ['TORCH_NCCL_AVOID_RECORD_STREAMS'] = '1'\n", ["PT1514"]),
    ("launcher.py", "cmd = 'pip install torch --upgrade --extra-index-url https://download.pytorch.org/whl/cu117'\n",
     ["PT1512"]),
    ("train.py", "import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n", ["PT1515"]),
    ("deepspeed.json", '{\n  "env": {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}\n}\n', ["PT1501"]),
]


@pytest.mark.parametrize(("name", "src", "want"), FOUND, ids=[f[0] for f in FOUND])
def test_found(name, src, want):
    assert codes(src, name) == want


def test_notebook_cells_are_scanned_with_cell_and_line():
    import json

    nb = {"cells": [
        {"cell_type": "markdown", "source": ["TORCH_NCCL_TRACE_BUFFER_SIZE in prose is not a setting\n"]},
        {"cell_type": "code",
         "source": ["!pip install torch==2.14.0 --index-url https://download.pytorch.org/whl/cu126\n"]},
        {"cell_type": "code",
         "source": ["import torch.distributed as dist\n", "\n", "dist.init_process_group('nccl')\n"]},
        {"cell_type": "code", "source": ["%%bash\n", "export TORCH_DIST_USE_NCCL2=0\n"]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    found = scan_text(json.dumps(nb), "tutorial.ipynb")
    assert [(f.cell, f.line, f.code) for f in found] == [(2, 1, "PT1512"), (3, 3, "PT1515"), (4, 2, "PT1503")]
    assert found[1].where() == "tutorial.ipynb:cell 3:3"


def test_every_215_api_the_scanner_counts_exists_in_the_installed_torch():
    import importlib
    import inspect

    from pt215.upgrade_rules import NEW_IN_215

    for name in sorted(NEW_IN_215):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            break
        for i, attr in enumerate(parts[cut:]):
            if callable(obj) and i == len(parts[cut:]) - 1 and not hasattr(obj, attr):
                assert attr in inspect.signature(obj).parameters, name  # a keyword argument
            else:
                obj = getattr(obj, attr)
