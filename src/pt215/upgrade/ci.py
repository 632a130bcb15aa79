"""CI definitions, job by job, for `python -m pt215.upgrade` (chapter 7): which jobs put torch on Python 3.10.

A CI file names many interpreters; only some of them ever meet torch. PT1508 is reported for a job's Python 3.10
(or older) when that job installs torch itself: in its own steps, through a composite action it uses
(`uses: ./.github/actions/x`, whose `action.yml` is read), or through a requirements file that names torch. A job
that installs nothing, only lints or type-checks, pins an older torch on purpose (`pytorch-version: "2.1"`, an
"oldest requirements" job), or whose Python the project's own `requires-python` excludes (`uv sync` then picks
another interpreter; `pip install .` refuses) is not reported. GitHub Actions, GitLab CI, Lightning
(`.lightning/workflows`), Read the Docs and, by a generic walk, other YAML CI systems.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pt215.upgrade.rules import Finding, finding
from pt215.upgrade.text import _old, admits, installs_torch, toolkit_image

__all__ = ["Project", "scan_ci", "ci_kind", "project_for"]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PY_KEYS = {"python-version", "python", "python_version", "python-versions", "py", "pyver", "python_ver"}
TORCH_KEYS = re.compile(r"^(?:torch|pytorch)[-_]?(?:version)?$|^torch_ver$", re.IGNORECASE)
VERSION_RE = re.compile(r"^\s*[\"']?(3\.\d{1,2})(?:\.\d+)?[\"']?\s*$")
IMAGE_PY_RE = re.compile(r"(?:^|[/:])python:(3\.\d+)|[-_:.]py(3)\.?(\d{1,2})(?![\d.])")
#: Commands of a job that only lints, formats or type-checks (its torch version does not matter).
LINT_RE = re.compile(r"^\s*(?:ruff|black|isort|flake8|pylint|mypy|pyright|pre-commit|codespell|doc-builder|"
                     r"python3? -m (?:ruff|black|isort|flake8|pylint|mypy|pre_commit|pyright)|"
                     r"make (?:quality|style|lint|check|format|type)[\w-]*)\b|"
                     # a repository's own hygiene checks, by the name of what they run: licence headers, naming,
                     # type-annotation or docstring coverage, sanity tests
                     r"^\s*(?:python3?|pytest|bash|sh)\s+(?:-\S+\s+)*\S*(?:sanity|lint|licen[cs]e|type_coverage|"
                     r"typecheck|docstring|check_api_docs)\S*")
#: Lines that neither lint nor run anything that needs torch (installs, shell plumbing).
PLUMBING_RE = re.compile(r"^\s*(?:(?:uv )?pip3? (?:install|freeze|list|config)|python3? -m pip|uv (?:sync|venv|pip)|"
                         r"conda|echo|cd|git|ls|export|set|if|fi|then|else|exit|cat|tee|mkdir|printenv|which|"
                         r"true|false|python3? --version|source|\.|#|\}|\{|done|for|do)\b|^\s*$")
SCRIPT_RE = re.compile(r"^\s*(?:bash\s+|sh\s+|source\s+)?\.?/?([\w./-]+\.sh)\b", re.MULTILINE)
REQ_FILE_RE = re.compile(r"(?:-r|--requirement)\s+([\w./${}-]+)")
TORCH_LINE_RE = re.compile(r"^\s*(?:torch|pytorch)\b(?!-)|^\s*-e\s+\.|^\s*\.(?:\[|$)", re.MULTILINE)
OLD_TORCH_PIN_RE = re.compile(r"(?<![\w-])torch\s*==\s*(\d+\.\d+)")


@dataclass
class Project:
    """The repository a CI file belongs to: its root folder and the Python its own metadata requires."""

    root: Path | None = None
    requires_python: str | None = None
    depends_on_torch: bool = True
    _cache: dict[str, str | None] = field(default_factory=dict)

    def read(self, rel: str) -> str | None:
        """A file of the repository by relative path (None: absent, unreadable, or no root)."""
        if self.root is None or "$" in rel or ".." in Path(rel).parts:
            return None
        if rel not in self._cache:
            try:
                self._cache[rel] = (self.root / rel).read_text(encoding="utf-8", errors="replace")[:1_000_000]
            except OSError:
                self._cache[rel] = None
        return self._cache[rel]


def ci_kind(path: str) -> str | None:
    """github, gitlab, lightning, readthedocs, other (a file under a CI folder), or None (not a CI definition)."""
    parts = Path(path).parts
    name = Path(path).name.lower()
    if name.startswith(".readthedocs."):
        return "readthedocs"
    if name in (".gitlab-ci.yml", ".gitlab-ci.yaml") or ".gitlab" in parts:
        return "gitlab"
    if ".github" in parts:
        return "github"
    if ".lightning" in parts:
        return "lightning"
    if any(p in CI_FOLDERS for p in parts) or name in CI_FILES:
        return "other"
    return None


CI_FOLDERS = {".circleci", ".buildkite", ".azure-pipelines", ".azure", ".ci", ".jenkins", ".gitea", ".forgejo",
              ".woodpecker", ".drone", ".lightning", ".github", ".gitlab", ".devcontainer", ".docker"}
CI_FILES = {".travis.yml", "azure-pipelines.yml", "bitbucket-pipelines.yml", ".drone.yml", "cloudbuild.yaml",
            "appveyor.yml", ".cirrus.yml"}
_PROJECT_CACHE: dict[Path, Project] = {}


def project_for(path: Path) -> Project:
    """The Project of a CI file: the folder above its CI folder (or its own folder), read once per scan root."""
    parts = path.parts
    idx = next((i for i, p in enumerate(parts) if p in CI_FOLDERS), None)
    root = Path(*parts[:idx]) if idx else path.parent
    root = root if str(root) else Path(".")
    if root not in _PROJECT_CACHE:
        spec, torch_dep = None, True
        for name in ("pyproject.toml", "setup.cfg", "setup.py"):
            try:
                text = (root / name).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            m = re.search(r"""(?:requires-python|python_requires)["']?\s*[=:]\s*["']([^"']+)["']""", text)
            if m:
                spec = m.group(1)
                torch_dep = bool(re.search(r"""["'\s](?:torch|pytorch)\s*(?:[<>=!~;\[,"']|$)""", text, re.M))
                break
        _PROJECT_CACHE[root] = Project(root, spec, torch_dep)
    return _PROJECT_CACHE[root]


# ---------------------------------------------------------------- YAML nodes, with their lines


def _docs(text: str) -> list[yaml.Node] | None:
    try:
        return [d for d in yaml.compose_all(text, Loader=_LOADER) if d is not None]
    except (yaml.YAMLError, RecursionError, ValueError):
        return None


def _get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


def _items(node: yaml.Node | None) -> Iterator[tuple[str, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                yield k.value, v


def _seq(node: yaml.Node | None) -> list[yaml.Node]:
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _str(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) and isinstance(node.value, str) else None


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _strings(node: yaml.Node | None) -> Iterator[str]:
    """Every scalar under a node (a job's scripts, wherever the CI system keeps them)."""
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.ScalarNode):
            yield str(n.value)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(v for _, v in n.value)


def _versions(node: yaml.Node | None) -> list[tuple[str, int]]:
    """(version, line) of a scalar or a list of Python versions; expressions and other values are skipped."""
    out = []
    for n in ([node] if isinstance(node, yaml.ScalarNode) else _seq(node)):
        v = _str(n)
        m = VERSION_RE.match(v) if v is not None else None
        if m:
            out.append((m.group(1), _line(n)))
    return out


# ---------------------------------------------------------------- what a job does


@dataclass
class _Job:
    name: str
    texts: list[str] = field(default_factory=list)
    candidates: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)  # (python, line, entry)
    images: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)  # (image, line, entry)


def _installs(job: _Job, project: Project) -> bool:
    for text in job.texts:
        if installs_torch(_without_no_deps_projects(text)):
            return True
        folder = ""
        for ln in text.splitlines():  # `cd docs` then `pip install -r requirements.txt` reads docs/requirements.txt
            cd = re.match(r"\s*cd\s+([\w./-]+)\s*(?:&&|;|$)", ln)
            if cd:
                folder = "" if cd.group(1) in (".", "/") else cd.group(1).strip("/") + "/"
            for m in REQ_FILE_RE.finditer(ln):
                req = project.read(folder + m.group(1))
                if req is None or TORCH_LINE_RE.search(req):
                    return True
    return False


def _without_no_deps_projects(text: str) -> str:
    """A `pip install --no-deps -e .` brings the project but not torch: drop such lines before the check."""
    return "\n".join(ln for ln in text.splitlines()
                     if not ("--no-deps" in ln and not re.search(r"(?<![\w-])(?:torch|pytorch)(?![\w-])", ln)))


def _lint_only(job: _Job) -> bool:
    """Only lint, format or type-check commands besides installs and shell plumbing (at least one of them)."""
    lines = [ln.strip() for t in job.texts for ln in t.splitlines() if not PLUMBING_RE.match(ln)]
    return bool(lines) and all(LINT_RE.match(ln) for ln in lines) and not any("${{" in ln for ln in lines)


def _follow_scripts(job: _Job, project: Project) -> None:
    """Add the text of the repository's own shell scripts a job runs (`./run_examples.sh`), one level deep."""
    for text in list(job.texts):
        for m in SCRIPT_RE.finditer(text):
            script = project.read(m.group(1).lstrip("./") if m.group(1).startswith("./") else m.group(1))
            if script:
                job.texts.append(script)


def _pins_old_torch(job: _Job, entry: dict[str, str]) -> bool:
    for k, v in entry.items():
        if TORCH_KEYS.match(k) and (re.match(r"\d+\.\d+", v) and _old_torch(v) or re.search(r"oldest|min", v)):
            return True
        if re.search(r"oldest|minimum", f"{k} {v}", re.IGNORECASE):
            return True
    pins = [m.group(1) for t in job.texts for m in OLD_TORCH_PIN_RE.finditer(t)]
    return bool(pins) and all(_old_torch(p) for p in pins) and not any("${{" in t and "torch==" in t
                                                                         for t in job.texts)


def _old_torch(version: str) -> bool:
    try:
        return admits("<2.15", version)
    except ValueError:
        return False


def _oldest_branch(job: _Job, python: str) -> bool:
    """A script that switches to its oldest requirements for this Python (`if [ "$py" == "3.10" ]; ... oldest`)."""
    for text in job.texts:
        lines = text.splitlines()
        for i, ln in enumerate(lines):
            if re.search(r"==\s*[\"']?" + re.escape(python) + r"[\"']?", ln):
                if any(re.search(r"oldest|minimum", x, re.IGNORECASE) for x in lines[i: i + 6]):
                    return True
    return False


def _report(job: _Job, project: Project, path: str, system: str) -> list[Finding]:
    _follow_scripts(job, project)
    installs = _installs(job, project)
    if not installs or _lint_only(job):
        return []
    by_line: dict[int, list[str]] = {}
    for python, line, entry in job.candidates:
        if not _old(python) or _pins_old_torch(job, entry) or _oldest_branch(job, python):
            continue
        if project.requires_python:
            try:
                if not admits(project.requires_python, python):
                    continue  # uv picks a matching interpreter; pip refuses to install the project
            except ValueError:
                pass
        by_line.setdefault(line, []).append(python)
    out = [finding(path, line, "PT1508", what=f"the {system} job {job.name!r}, which installs torch,",
                   low=max(vs, key=lambda v: tuple(map(int, v.split(".")))))
           for line, vs in sorted(by_line.items())]
    for image, line, entry in job.images:
        cuda = toolkit_image(image)
        if cuda and not _pins_old_torch(job, entry) and not (entry.get("_python") and _oldest_branch(
                job, entry["_python"])):
            out.append(finding(path, line, "PT1512", what=f"the CUDA {cuda} devel image {image} of the {system} job "
                               f"{job.name!r} (which installs torch)"))
    return out


def _entry(node: yaml.Node | None) -> dict[str, str]:
    return {k: str(v.value) for k, v in _items(node) if isinstance(v, yaml.ScalarNode)}


def _matrix(job: _Job, matrix: yaml.Node | None) -> None:
    for k, v in _items(matrix):
        if k in PY_KEYS:
            job.candidates += [(ver, line, {}) for ver, line in _versions(v)]
    for inc in _seq(_get(matrix, "include")):
        entry = _entry(inc)
        for k, v in _items(inc):
            if k in PY_KEYS:
                job.candidates += [(ver, line, entry) for ver, line in _versions(v)]
            if k in PY_KEYS or not isinstance(v, yaml.MappingNode):
                continue
            for k2, v2 in _items(v):  # include: - python: "3.10" task: {name: ..., run: ...}
                if k2 in ("run", "script", "cmd"):
                    s = _str(v2)
                    if s:
                        job.texts.append(s)


def _action_texts(uses: str, project: Project, depth: int = 0) -> list[str]:
    """The run steps of a local composite action (`uses: ./.github/actions/x`), followed into the actions it uses."""
    rel = uses[2:].rstrip("/")
    for name in ("action.yml", "action.yaml"):
        text = project.read(f"{rel}/{name}")
        if text is not None:
            break
    else:
        return []
    docs = _docs(text) or []
    out = []
    for doc in docs:
        for step in _seq(_get(_get(doc, "runs"), "steps")):
            run = _str(_get(step, "run"))
            if run:
                out.append(run)
            inner = _str(_get(step, "uses"))
            if inner and inner.startswith("./") and depth < 3:
                out += _action_texts(inner, project, depth + 1)
    return out


def _github(doc: yaml.Node, project: Project) -> list[_Job]:
    jobs = []
    for name, node in _items(_get(doc, "jobs")):
        if _get(node, "uses") is not None:  # a reusable workflow: scanned as its own file
            continue
        job = _Job(name)
        _matrix(job, _get(_get(node, "strategy"), "matrix"))
        container = _get(node, "container")
        image = _get(container, "image") if isinstance(container, yaml.MappingNode) else container
        if _str(image):
            job.images.append((_str(image), _line(image), {}))
            m = IMAGE_PY_RE.search(_str(image))
            if m:
                job.candidates.append((m.group(1) or f"{m.group(2)}.{m.group(3)}", _line(image), {}))
        job.texts += [f"{k}={_str(v)}" for k, v in _items(_get(node, "env")) if _str(v)]
        for step in _seq(_get(node, "steps")):
            run = _str(_get(step, "run"))
            if run:
                job.texts.append(run)
            job.texts += [f"{k}={_str(v)}" for k, v in _items(_get(step, "env")) if _str(v)]
            uses = _str(_get(step, "uses")) or ""
            if uses.startswith("./"):
                job.texts += _action_texts(uses, project)
            with_ = _get(step, "with")
            for k, v in _items(with_):
                if k in PY_KEYS:
                    job.candidates += [(ver, line, {}) for ver, line in _versions(v)]
        jobs.append(job)
    return jobs


_GITLAB_RESERVED = {"stages", "variables", "include", "default", "workflow", "image", "services", "before_script",
                    "after_script", "cache", "pages"}


def _gitlab(doc: yaml.Node) -> list[_Job]:
    default = _get(doc, "default")
    default_image = _get(default, "image") or _get(doc, "image")
    default_before = list(_strings(_get(default, "before_script") or _get(doc, "before_script")))
    jobs = []
    for name, node in _items(doc):
        if name in _GITLAB_RESERVED or not isinstance(node, yaml.MappingNode):
            continue
        if _get(node, "script") is None and _get(node, "before_script") is None:
            continue
        job = _Job(name, texts=default_before + [s for k in ("before_script", "script")
                                                 for s in _strings(_get(node, k))])
        image = _get(node, "image") or default_image
        image = _get(image, "name") if isinstance(image, yaml.MappingNode) else image
        if _str(image):
            job.images.append((_str(image), _line(image), {}))
            m = IMAGE_PY_RE.search(_str(image))
            if m:
                job.candidates.append((m.group(1) or f"{m.group(2)}.{m.group(3)}", _line(image), {}))
        jobs.append(job)
    return jobs


def _lightning(doc: yaml.Node) -> list[_Job]:
    job = _Job(_str(_get(doc, "name")) or "workflow", texts=list(_strings(_get(doc, "run"))))
    root_image = _get(doc, "image")
    if _str(root_image):
        job.images.append((_str(root_image), _line(root_image), {}))
    params = _get(doc, "parametrize")
    for k, v in _items(_get(params, "matrix")):
        if k in PY_KEYS:
            job.candidates += [(ver, line, {}) for ver, line in _versions(v)]
    for inc in _seq(_get(params, "include")):
        entry = _entry(inc)
        for k, v in _items(inc):
            if k in PY_KEYS:
                job.candidates += [(ver, line, entry) for ver, line in _versions(v)]
        image = _get(inc, "image")
        if _str(image):
            py = next((e for k, e in entry.items() if k in PY_KEYS), "")
            job.images.append((_str(image), _line(image), {**entry, "_python": py}))
    return [job]


def _readthedocs(doc: yaml.Node, project: Project) -> list[_Job]:
    job = _Job("docs")
    python = _get(_get(_get(doc, "build"), "tools"), "python")
    job.candidates += [(ver, line, {}) for ver, line in _versions(python)]
    for inst in _seq(_get(_get(doc, "python"), "install")):
        req = _str(_get(inst, "requirements"))
        if req:
            job.texts.append(f"pip install -r {req}")
        if _str(_get(inst, "method")) in ("pip", "setuptools") and project.depends_on_torch:
            job.texts.append(f"pip install {_str(_get(inst, 'path')) or '.'}")
    job.texts += list(_strings(_get(_get(doc, "build"), "commands")))
    job.texts += list(_strings(_get(_get(doc, "build"), "jobs")))
    job.texts.append("sphinx-build docs")  # what the job runs: it needs the installed torch to import the code
    return [job]


def _generic(doc: yaml.Node, text: str) -> list[_Job]:
    job = _Job("pipeline", texts=[text])
    stack = [doc]
    while stack:
        n = stack.pop()
        for k, v in _items(n):
            if k in PY_KEYS:
                job.candidates += [(ver, line, {}) for ver, line in _versions(v)]
            elif k == "image" and _str(v):
                job.images.append((_str(v), _line(v), {}))
                m = IMAGE_PY_RE.search(_str(v))
                if m:
                    job.candidates.append((m.group(1) or f"{m.group(2)}.{m.group(3)}", _line(v), {}))
            stack.append(v)
        stack.extend(_seq(n))
    return [job]


def scan_ci(text: str, path: str, project: Project | None = None) -> list[Finding] | None:
    """PT1508 (and PT1512 for CUDA 12 devel images) per CI job; None when the file is not YAML that parses
    (the caller then reads it by pattern)."""
    kind = ci_kind(path)
    if kind is None:
        return None
    docs = _docs(text)
    if docs is None:
        return None
    project = project or Project()
    system = {"github": "GitHub Actions", "gitlab": "GitLab CI", "lightning": "Lightning CI",
              "readthedocs": "Read the Docs", "other": "CI"}[kind]
    out: list[Finding] = []
    for doc in docs:
        if kind == "github":
            jobs = _github(doc, project)
        elif kind == "gitlab":
            jobs = _gitlab(doc)
        elif kind == "lightning":
            jobs = _lightning(doc)
        elif kind == "readthedocs":
            jobs = _readthedocs(doc, project)
        else:
            jobs = _generic(doc, text)
        for job in jobs:
            out += _report(job, project, path, system)
    return out


