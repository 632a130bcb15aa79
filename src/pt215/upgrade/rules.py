"""The codes of `python -m pt215.upgrade` (chapter 7): what each finds, its severity, its fix and its evidence.

Severity decides the exit status: `error` and `warning` findings fail a run (exit 1), `info` findings are
printed but never fail it. Every table here is checked against the installed torch 2.15.0 by
`tests/upgrade/`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pt215.upgrade.environment import FR_LEGACY, NCCL_GATES

__all__ = ["Rule", "Finding", "RULES", "SEVERITIES", "FAILING", "FR_LEGACY", "FR_MISSING", "USE_NCCL2",
           "NO_WEIGHTS_ONLY", "UNREAD_215", "ACC_POLICIES", "NEW_IN_215", "NCCL_GATES", "CUDNN_215", "NCCL_215",
           "RPATH_FOLDERS", "finding", "explain"]

SEVERITIES = ("error", "warning", "info")
FAILING = frozenset({"error", "warning"})


@dataclass(frozen=True)
class Rule:
    """One code: severity, what it finds, the fix, and the book section that explains it (label, title)."""

    code: str
    severity: str
    title: str
    fix: str
    label: str
    section: str
    summary: str = ""
    fixable: bool = False
    evidence: str = ""


@dataclass(frozen=True)
class Finding:
    """One finding: where (file, line, notebook cell), which code, its severity and a message with the fix."""

    path: str
    line: int
    code: str
    message: str
    fix: str
    section: str
    label: str
    severity: str = "warning"
    cell: int | None = None

    def where(self) -> str:
        """`path:line` or, in a notebook, `path:cell N:line`."""
        return f"{self.path}:cell {self.cell}:{self.line}" if self.cell is not None else f"{self.path}:{self.line}"

    def text(self) -> str:
        """`path:line: CODE [severity] message: fix (book: section)`, the linter line."""
        return f"{self.where()}: {self.code} [{self.severity}] {self.message}: {self.fix} (book: {self.section})"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


#: Flight-recorder variables renamed to TORCH_FR_* (`FlightRecorder.hpp`): one table, shared with the environment
#: checks; and the NCCL versions the 2.15 NCCL2 backend gates features on (`nccl2/NcclApi.hpp`).
FR_MISSING = "TORCH_NCCL_ENABLE_FLIGHT_RECORDER"
USE_NCCL2 = "TORCH_DIST_USE_NCCL2"
NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: Variables that torch 2.15 reads nowhere (no .py file, no string in its shared libraries): a test checks it.
UNREAD_215: dict[str, str] = {
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "NCCL2 never calls record_stream on collective tensors, so what the "
                                       "variable asked for is 2.15's behaviour; no backend reads it",
}
#: `torch.nn.modules.linear_cross_entropy_options._VALID_ACC_POLICIES` in 2.15.0 (a test checks they agree).
ACC_POLICIES = ("auto", "accurate", "compact")
#: Qualified names of APIs that torch 2.15.0 has and torch 2.14.0 does not (read from both wheels:
#: `data/07-upgrading/evidence.json`, written by `python -m pt215.upgrade.evidence`; a test keeps the two equal).
#: Evidence for PT1509. They count only when the code reaches them through torch. `F.linear_cross_entropy`,
#: `LinearCrossEntropyLoss`/`Options` (in 2.13 already), `enable_reconfigure` and `_get_reconfigure_handle` (2.14),
#: the TORCH_FR_* names and the nccl2 backend name are no evidence.
NEW_IN_215 = frozenset({
    "torch.distributed.fsdp.MixedPrecisionPolicy.param_dtype_override_fn",
    "torch.distributed._transport",
})
#: What the 2.15.0 CUDA wheel requires (`torch-2.15.0.dist-info/METADATA`, Requires-Dist).
CUDNN_215 = (9, 26)
NCCL_215 = (2, 30, 7)
#: The folders `libtorch_cuda.so`'s DT_RPATH names, searched before LD_LIBRARY_PATH (`readelf -d`; a test reads it).
RPATH_FOLDERS = ("nvidia/cudnn/lib", "nvidia/nvshmem/lib", "nvidia/nccl/lib", "nvidia/cusparselt/lib",
                 "nvidia/cu13/lib")


def _by_code(rules: list[Rule]) -> dict[str, Rule]:
    """The rules keyed by code, in order; two rules with one code are an error, not a silent overwrite."""
    out: dict[str, Rule] = {}
    for rule in rules:
        if rule.code in out:
            raise ValueError(f"two rules have the code {rule.code}")
        out[rule.code] = rule
    return out


#: Every rule of the scanner, by code (`python -m pt215.upgrade --explain CODE` prints one). Severity says what a
#: team must do for 2.15: `error` (the job breaks), `warning` (a change or a check to make), `info` (true, and
#: nothing to do for 2.15).
RULES: dict[str, Rule] = _by_code([
    Rule("PT1501", "info", "{name} is the legacy flight-recorder name, which 2.15 still reads",
         "nothing to change for 2.15: its recorder reads {new} first and falls back to {name} with a deprecation "
         "warning. A job that can roll back (nccl-legacy, TORCH_DIST_USE_NCCL2=0) needs {name}: the legacy "
         "ProcessGroupNCCL reads only that name. Set both to silence the warning", "fr-settings",
         "chapter 2, The settings", "legacy flight-recorder variable name (read by 2.15 and by the legacy backend)",
         evidence="FlightRecorder.hpp: getCvarInt({\"TORCH_FR_BUFFER_SIZE\", \"TORCH_NCCL_TRACE_BUFFER_SIZE\"}); "
                  "legacy ProcessGroupNCCL.hpp reads only TORCH_NCCL_TRACE_BUFFER_SIZE, _DUMP_ON_TIMEOUT, "
                  "_WAIT_TIMEOUT_DUMP_MILSEC; torch 2.14's FlightRecorder.hpp reads the same pairs"),
    Rule("PT1502", "warning", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER does not exist",
         "delete it: setting it changes nothing (the recorder is on whenever TORCH_FR_BUFFER_SIZE > 0, default "
         "2000); if it was meant to turn recording off, set TORCH_FR_BUFFER_SIZE=0", "fr-settings",
         "chapter 2, The settings", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER (never existed)",
         evidence="no such string in torch 2.15's Python files or shared libraries"),
    Rule("PT1503", "warning", "TORCH_DIST_USE_NCCL2=0 selects the legacy NCCL backend",
         "on 2.15 this job runs the pre-2.15 ProcessGroupNCCL, not the default NCCL2: A/B it on \"nccl\" without "
         "the variable, then delete it or keep it as the job's recorded rollback", "nccl2-migration",
         "chapter 1, Migration plan", "TORCH_DIST_USE_NCCL2=0 (the legacy backend)",
         evidence="distributed_c10d._register_builtin_nccl_backend: creator is _create_nccl_process_group only "
                  "when TORCH_DIST_USE_NCCL2 == \"0\""),
    Rule("PT1504", "warning", "\"nccl-legacy\" builds the pre-2.15 ProcessGroupNCCL",
         "this job does not run 2.15's default NCCL2: use \"nccl\", or keep nccl-legacy only in a labelled "
         "comparison job", "nccl2-migration", "chapter 1, Migration plan", "\"nccl-legacy\" backend name",
         evidence="distributed_c10d._register_builtin_nccl_legacy_backend"),
    Rule("PT1505", "warning", "MixedPrecisionPolicy sets param_dtype={param} and {how}",
         "2.15 reduces gradients in each parameter's grad_dtype, else its stored dtype: parameters stored in fp32 "
         "now reduce in fp32, twice the bytes of 2.14's param_dtype reduction (parameters stored in bf16 still "
         "reduce in bf16). Set reduce_dtype explicitly: reduce_dtype={param} keeps 2.14's bytes",
         "upgrade-reduce-dtype", "chapter 7, FSDP2 reduce_dtype", "MixedPrecisionPolicy without reduce_dtype",
         fixable=True, evidence="_fsdp_api.py: MixedPrecisionPolicy.reduce_dtype, versionchanged:: 2.15"),
    Rule("PT1506", "error", "acc_policy={value!r} does not exist",
         "use one of 'auto', 'accurate', 'compact' (LinearCrossEntropyOptions raises ValueError otherwise)",
         "upgrade-acc-policy", "chapter 7, acc_policy", "acc_policy value that does not exist",
         evidence="linear_cross_entropy_options._VALID_ACC_POLICIES"),
    Rule("PT1507", "warning", "{writer}: readers must be on 2.15",
         "2.15 pickles TensorProperties with 6 fields (strides added); 2.14's __setstate__ unpacks 5 and cannot "
         "read the .metadata: upgrade every reader (evaluation, export, conversion, resumption) with the writers",
         "upgrade-dcp", "chapter 7, DCP checkpoints", "DCP checkpoint metadata written: readers must be on 2.15",
         evidence="checkpoint/metadata.py: TensorProperties.strides and a 6-field __getstate__; torch 2.14.0's "
                  "__setstate__ unpacks 5 fields; FileSystemWriter.finish pickles Metadata"),
    Rule("PT1508", "warning", "{what} admits Python {low}",
         "torch 2.15 has no wheel for Python 3.10 or older (Requires-Python: >=3.11): there pip silently installs "
         "torch 2.14 or older. Require >=3.11, or run this job on 3.11+", "upgrade-python",
         "chapter 7, Python and wheels", "Python 3.10 or older where torch is installed", fixable=True,
         evidence="torch-2.15.0.dist-info/METADATA: Requires-Python: >=3.11 (2.14.0: >=3.10)"),
    Rule("PT1509", "error", "torch pinned below 2.15 ({spec}) but {use} uses {api}, new in 2.15",
         "pin torch>=2.15 (or drop the 2.15-only call): the pinned release has no such API", "upgrade-pins",
         "chapter 7, Pins", "torch pinned below 2.15 next to a 2.15 API",
         evidence="data/07-upgrading/evidence.json: absent from the torch 2.14.0 wheel, present in 2.15.0"),
    Rule("PT1510", "info", "{what} unpickles arbitrary code",
         "a security lint, not a 2.15 change (weights_only=True has been the default since 2.6): load with "
         "weights_only=True and no pickle_module (weights_only=True refuses one with a RuntimeError), and allow "
         "your own classes with torch.serialization.add_safe_globals([...])",
         "upgrade-torch-load", "chapter 7, torch.load",
         "torch.load(weights_only=False), or a pickle_module without weights_only=True (informational)",
         evidence="serialization.py: weights_only unset defaults to _default_to_weights_only(pickle_module), True "
                  "only when pickle_module is None; weights_only=True with a pickle_module raises RuntimeError"),
    Rule("PT1511", "error", "TORCH_TARGET_VERSION {value} targets torch {target}, newer than the 2.15 headers",
         "lower it to <= 0x020f000000000000 (2.15) or build against a newer torch; a larger value is a "
         "compile error", "upgrade-cpp", "chapter 7, C++ extensions", "TORCH_TARGET_VERSION newer than 2.15",
         evidence="torch/csrc/stable/version.h"),
    Rule("PT1512", "warning", "{what} is a CUDA 12 (or older) build",
         "torch 2.15's CUDA wheel is built for CUDA 13.2 (torch.version.cuda) and requires nvidia-*-cu13 "
         "libraries; a CUDA 12 wheel index has no 2.15, a CUDA 12 toolkit cannot build extensions against it "
         "(torch.utils.cpp_extension refuses a CUDA major mismatch): move the index, the image and the nvidia-* "
         "pins to CUDA 13", "upgrade-python", "chapter 7, Python and wheels",
         "CUDA 12 (or older) wheel index, image or nvidia-*-cu12 library",
         evidence="torch-2.15.0+cu132 METADATA: nvidia-cudnn-cu13==9.26.0.51, nvidia-nccl-cu13==2.30.7; "
                  "cpp_extension._check_cuda_version raises on a major mismatch"),
    Rule("PT1513", "warning", "{what} {version} is older than the {need} the 2.15 wheel requires",
         "{fix}", "upgrade-nccl", "chapter 7, NCCL and cuDNN",
         "pip NCCL or cuDNN pinned below what the 2.15 wheel requires",
         evidence="libtorch_cuda.so DT_RPATH names nvidia/nccl/lib and nvidia/cudnn/lib; nvidia-nccl-cu12 and "
                  "nvidia-cudnn-cu12 wheels write the same files (data/07-upgrading/evidence.json)"),
    Rule("PT1514", "info", "{name} is read nowhere in torch 2.15",
         "nothing breaks: {why}. Delete it when convenient", "upgrade-unread",
         "chapter 7, Variables 2.15 no longer reads", "a variable torch 2.15 no longer reads (informational)",
         evidence="no string in torch 2.15's Python files or shared libraries"),
    Rule("PT1515", "info", "init_process_group(\"nccl\") without device_id",
         "2.15's NCCL2 creates the communicator eagerly on cuda:(LOCAL_RANK % device_count): pass "
         "device_id=torch.device(\"cuda\", local_rank) so that it is the device you meant", "upgrade-device-id",
         "chapter 7, device_id", "init_process_group(\"nccl\") without device_id (informational)",
         evidence="distributed_c10d._nccl2_device"),
    Rule("PT1516", "error", "{what}: torch 2.15's headers need C++20",
         "{fix}", "upgrade-cpp", "chapter 7, C++ extensions",
         "a C++ standard older than C++20 where torch's headers are compiled",
         evidence="ATen/ATen.h and torch/all.h: '#error C++20 or later compatible compiler is required'; "
                  "BuildExtension adds -std=c++20 only when no -std is given; load() puts the user's flags after "
                  "its own; TorchConfig.cmake's INTERFACE cxx_std_20 comes after CMAKE_CXX_FLAGS"),
    Rule("PT1517", "info", "{what}: only TORCH_DIST_USE_NCCL2=0 changes the backend",
         "nothing to change: 2.15 builds NCCL2 for \"nccl\" unless the value is exactly \"0\" (2.14's opt-in "
         "TORCH_DIST_USE_NCCL2=1 is 2.15's default)", "nccl2-migration", "chapter 1, Migration plan",
         "TORCH_DIST_USE_NCCL2 read, or set to a value other than 0 (informational)",
         evidence="distributed_c10d._register_builtin_nccl_backend (2.15: == \"0\"; 2.14: == \"1\")"),
    Rule("PT1518", "warning", "{what} {version} is pinned: check which torch loads it",
         "a pip-installed torch does not load it (import torch preloads site-packages/{folder}/{lib}, and "
         "libtorch_cuda.so's DT_RPATH names that folder before LD_LIBRARY_PATH): then nothing to change. A torch "
         "built from source against the system library (an NGC nvcr.io/nvidia/pytorch base image, a conda or "
         "source build) loads this one: check the pin against the version the 2.15 base image's torch was built "
         "with", "upgrade-nccl", "chapter 7, NCCL and cuDNN",
         "a system (apt) NCCL or cuDNN pin: check which torch loads it",
         evidence="torch/__init__.py _preload_cuda_deps loads nvidia/nccl/lib/libnccl.so.* from sys.path; readelf "
                  "-d libtorch_cuda.so: RPATH $ORIGIN/../../nvidia/cudnn/lib:...:$ORIGIN/../../nvidia/nccl/lib; "
                  "notebook 7.1 maps the wheel's libnccl.so.2 with another one on LD_LIBRARY_PATH"),
    Rule("PT1520", "info", "{what} {version} is pinned in an image built on {base}: its pip torch loads the "
         "wheel's own {lib}",
         "nothing to change for torch: the image is not built on NGC's PyTorch, so its torch is a pip (or conda) "
         "build, and import torch preloads site-packages/{folder}/{lib} (libtorch_cuda.so's DT_RPATH names that "
         "folder before LD_LIBRARY_PATH); the apt pin serves other programs in the image",
         "upgrade-nccl", "chapter 7, NCCL and cuDNN",
         "a system (apt) NCCL or cuDNN pin in a Dockerfile not built on NGC's PyTorch (informational)",
         evidence="torch/__init__.py _preload_cuda_deps; readelf -d libtorch_cuda.so RPATH; notebook 7.1 maps the "
                  "wheel's libnccl.so.2 with another one on LD_LIBRARY_PATH"),
    Rule("PT1519", "info", "{what}",
         "nothing to change in this file: its path names the stack it builds ({pin}); write the 2.15 recipe "
         "next to it", "upgrade-python", "chapter 7, Python and wheels",
         "a pin inside a recipe whose path names an older torch or CUDA (informational)"),
])


def finding(path: str, line: int, code: str, cell: int | None = None, **fmt: object) -> Finding:
    """A finding of `code` at `path:line`, its message and fix formatted with `fmt`."""
    rule = RULES[code]
    return Finding(path, line, code, rule.title.format(**fmt), rule.fix.format(**fmt), rule.section, rule.label,
                   rule.severity, cell)


def explain(code: str) -> str:
    """`--explain CODE`: the rule's severity, what it finds, its fix, its evidence and its book section."""
    rule = RULES.get(code.upper().strip())
    if rule is None:
        raise KeyError(f"unknown code {code!r}; expected one of {', '.join(RULES)}")
    fix = rule.fix if "{" not in rule.fix or rule.fix == "{fix}" else rule.fix.replace("{", "<").replace("}", ">")
    lines = [f"{rule.code} ({rule.severity}): {rule.summary}",
             f"  fix: {'depends on the finding' if fix == '{fix}' else fix}",
             f"  fixable by --fix: {'yes' if rule.fixable else 'no'}",
             f"  book: {rule.section} (label {rule.label})"]
    if rule.evidence:
        lines.insert(3, f"  evidence in torch 2.15: {rule.evidence}")
    return "\n".join(lines)

