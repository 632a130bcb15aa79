"""The codes of `python -m pt215.upgrade` (chapter 7): what each finds, its severity, its fix and its evidence.

Severity decides the exit status: `error` and `warning` findings fail a run (exit 1), `info` findings are
printed but never fail it. Every table here is checked against the installed torch 2.15.0 by
`tests/test_upgrade.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pt215.upgrade_checks import FR_LEGACY, NCCL_GATES

__all__ = ["Rule", "Finding", "RULES", "SEVERITIES", "FAILING", "FR_LEGACY", "FR_MISSING", "USE_NCCL2",
           "NO_WEIGHTS_ONLY", "UNREAD_215", "ACC_POLICIES", "NEW_IN_215", "NCCL_GATES", "CUDNN_215", "NCCL_215",
           "finding", "explain"]

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
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "NCCL2 never calls record_stream on collective tensors; the "
                                       "variable is read by neither backend",
}
#: `torch.nn.modules.linear_cross_entropy_options._VALID_ACC_POLICIES` in 2.15.0 (a test checks they agree).
ACC_POLICIES = ("auto", "accurate", "compact")
#: Qualified names of APIs the book shows are new in 2.15 (chapters 1, 3, 4, 7): evidence for PT1509. They
#: count only when the code reaches them through torch (an import from torch, or a torch.* attribute);
#: the TORCH_FR_* names and the nccl2 backend name are no evidence (public code used them before 2.15).
NEW_IN_215 = frozenset({
    "torch.distributed.fsdp.MixedPrecisionPolicy.param_dtype_override_fn",
    "torch.nn.LinearCrossEntropyOptions", "torch.nn.modules.linear_cross_entropy_options.LinearCrossEntropyOptions",
    "torch.nn.LinearCrossEntropyLoss", "torch.nn.modules.loss.LinearCrossEntropyLoss",
    "torch.nn.functional.linear_cross_entropy",
    "torch.distributed.init_process_group.enable_reconfigure", "torch.distributed._get_reconfigure_handle",
    "torch.distributed._transport",
})
#: What the 2.15.0 CUDA wheel requires (`torch-2.15.0.dist-info/METADATA`, Requires-Dist).
CUDNN_215 = (9, 26)
NCCL_215 = (2, 30, 7)

def _by_code(rules: list[Rule]) -> dict[str, Rule]:
    """The rules keyed by code, in order; two rules with one code are an error, not a silent overwrite."""
    out: dict[str, Rule] = {}
    for rule in rules:
        if rule.code in out:
            raise ValueError(f"two rules have the code {rule.code}")
        out[rule.code] = rule
    return out


#: Every rule of the scanner, by code (`python -m pt215.upgrade --explain CODE` prints one).
RULES: dict[str, Rule] = _by_code([
    Rule("PT1501", "warning", "{name} is the legacy flight-recorder name",
         "add {new} next to it: 2.15's recorder reads {new} first and logs a deprecation warning for the legacy "
         "name; keep {name} while any job may roll back to nccl-legacy or TORCH_DIST_USE_NCCL2=0, whose "
         "ProcessGroupNCCL reads only the legacy name", "fr-settings", "chapter 2, The settings",
         "legacy flight-recorder variable name",
         evidence="FlightRecorder.hpp: getCvarInt({\"TORCH_FR_BUFFER_SIZE\", \"TORCH_NCCL_TRACE_BUFFER_SIZE\"}); "
                  "legacy ProcessGroupNCCL.hpp reads only TORCH_NCCL_TRACE_BUFFER_SIZE, _DUMP_ON_TIMEOUT, "
                  "_WAIT_TIMEOUT_DUMP_MILSEC"),
    Rule("PT1502", "error", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER does not exist",
         "delete it; the recorder is on whenever TORCH_FR_BUFFER_SIZE > 0 (default 2000)", "fr-settings",
         "chapter 2, The settings", "TORCH_NCCL_ENABLE_FLIGHT_RECORDER (never existed)",
         evidence="no such string in torch 2.15's Python files or shared libraries"),
    Rule("PT1503", "warning", "TORCH_DIST_USE_NCCL2 is the switch back to the legacy NCCL backend",
         "only the exact string \"0\" has an effect (legacy ProcessGroupNCCL, planned for removal): A/B the job "
         "on nccl and delete the variable", "nccl2-migration", "chapter 1, Migration plan",
         "TORCH_DIST_USE_NCCL2 (legacy backend switch)",
         evidence="distributed_c10d._register_builtin_nccl_backend"),
    Rule("PT1504", "warning", "\"nccl-legacy\" builds the pre-2.15 ProcessGroupNCCL",
         "use \"nccl\" (ProcessGroupNCCL2); keep nccl-legacy only in a labelled comparison job",
         "nccl2-migration", "chapter 1, Migration plan", "\"nccl-legacy\" backend name",
         evidence="distributed_c10d._register_builtin_nccl_legacy_backend"),
    Rule("PT1505", "warning", "MixedPrecisionPolicy sets param_dtype={param} and {how}",
         "2.15 reduces gradients in each parameter's grad_dtype (fp32 for fp32 parameters), 2x the bytes of "
         "2.14's param_dtype reduction: set reduce_dtype explicitly (reduce_dtype={param} keeps 2.14's bytes)",
         "upgrade-reduce-dtype", "chapter 7, FSDP2 reduce_dtype", "MixedPrecisionPolicy without reduce_dtype",
         fixable=True, evidence="_fsdp_api.py: MixedPrecisionPolicy, versionchanged:: 2.15"),
    Rule("PT1506", "error", "acc_policy={value!r} does not exist",
         "use one of 'auto', 'accurate', 'compact' (LinearCrossEntropyOptions raises ValueError otherwise)",
         "upgrade-acc-policy", "chapter 7, acc_policy", "acc_policy value that does not exist",
         evidence="linear_cross_entropy_options._VALID_ACC_POLICIES"),
    Rule("PT1507", "warning", "DCP save through {writer}: readers must be on 2.15",
         "2.15 records tensor strides in .metadata, which 2.14 and older cannot unpickle: upgrade every reader "
         "(evaluation, export, conversion) with the writers", "upgrade-dcp", "chapter 7, DCP checkpoints",
         "DCP save writing .metadata: readers must be on 2.15",
         evidence="checkpoint/metadata.py: TensorProperties.strides; FileSystemWriter pickles .metadata"),
    Rule("PT1508", "error", "{what} admits Python {low}",
         "2.15 ships wheels for Python 3.11-3.15 only: require >=3.11", "upgrade-python",
         "chapter 7, Python and wheels", "Python 3.10 or older required or installed", fixable=True,
         evidence="torch-2.15.0.dist-info/METADATA: Requires-Python: >=3.11"),
    Rule("PT1509", "error", "torch pinned below 2.15 ({spec}) but {use} uses {api}, new in 2.15",
         "pin torch>=2.15 (or drop the 2.15-only call)", "upgrade-pins", "chapter 7, Pins",
         "torch pinned below 2.15 next to a 2.15 API"),
    Rule("PT1510", "info", "{what} unpickles arbitrary code",
         "a security lint, not a 2.15 change (weights_only=True has been the default since 2.6): load with "
         "weights_only=True and allow your own classes with torch.serialization.add_safe_globals([...])",
         "upgrade-torch-load", "chapter 7, torch.load", "torch.load(weights_only=False) (informational)",
         evidence="serialization.py: weights_only defaults to True since 2.6"),
    Rule("PT1511", "error", "TORCH_TARGET_VERSION {value} targets torch {target}, newer than the 2.15 headers",
         "lower it to <= 0x020f000000000000 (2.15) or build against a newer torch; a larger value is a "
         "compile error", "upgrade-cpp", "chapter 7, C++ extensions", "TORCH_TARGET_VERSION newer than 2.15",
         evidence="torch/csrc/stable/version.h"),
    Rule("PT1512", "warning", "{what} is a CUDA 12 (or older) build",
         "2.15's CUDA wheels are CUDA 13.2 (PyPI default, whl/cu132) and 13.4 (whl/cu134), and they require "
         "nvidia-*-cu13 libraries: move the index and the nvidia-* pins to CUDA 13", "upgrade-python",
         "chapter 7, Python and wheels", "CUDA 12 (or older) wheel index or nvidia-*-cu12 library",
         evidence="torch-2.15.0.dist-info/METADATA: nvidia-cudnn-cu13==9.26.0.51, nvidia-nccl-cu13==2.30.7"),
    Rule("PT1513", "warning", "{what} {version} is below {gate}",
         "{fix}", "upgrade-nccl", "chapter 7, NCCL versions", "NCCL or cuDNN pinned below 2.15's gates",
         evidence="nccl2/NcclApi.hpp gates; METADATA: nvidia-cudnn-cu13==9.26.0.51"),
    Rule("PT1514", "warning", "{name} is read nowhere in torch 2.15",
         "delete it: {why}", "upgrade-unread", "chapter 7, Variables 2.15 no longer reads",
         "a variable torch 2.15 no longer reads",
         evidence="no string in torch 2.15's Python files or shared libraries"),
    Rule("PT1515", "info", "init_process_group(\"nccl\") without device_id",
         "2.15's NCCL2 creates the communicator eagerly on cuda:(LOCAL_RANK % device_count): pass "
         "device_id=torch.device(\"cuda\", local_rank) so that it is the device you meant", "upgrade-device-id",
         "chapter 7, device_id", "init_process_group(\"nccl\") without device_id (informational)",
         evidence="distributed_c10d._nccl2_device"),
    Rule("PT1516", "warning", "{what}: torch 2.15's headers need C++20",
         "build native code against torch 2.15 as C++20 (-std=c++20, CMAKE_CXX_STANDARD 20, cxx_std_20); "
         "torch.utils.cpp_extension already passes -std=c++20", "upgrade-cpp", "chapter 7, C++ extensions",
         "a C++ standard older than C++20 in a build file",
         evidence="ATen/ATen.h and torch/all.h: '#error C++20 or later compatible compiler is required'; "
                  "cpp_extension passes -std=c++20; TorchConfig.cmake adds INTERFACE cxx_std_20, so a CMake "
                  "project that uses find_package(Torch) is raised to C++20 unless it forces an -std= flag"),
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

