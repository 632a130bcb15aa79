"""`python -m pt215.upgrade PATH...`: find what PyTorch 2.15 changes in a team's code and configs (chapter 7).

A linter for one upgrade, with the conventions of ruff and flake8. It reads Python and notebook cells with
the `ast` module, names resolved by import origin (only what comes from torch counts), CI definitions job by job
(`pt215.upgrade.ci`), and shell scripts, Dockerfiles, YAML, TOML, INI/`setup.cfg`, JSON and requirements files by
pattern. It prints one finding per line, `path:line: CODE [severity] message: fix (book: section)`. Severity is
what a team must do for 2.15: `error` (the job breaks), `warning` (a change or a check), `info` (true, nothing
to do).

Exit status: 0 when nothing at `error` or `warning` severity was found (`info` findings never fail a run),
1 when something was, 2 on a usage error (a missing path, an unknown code, a bad `[tool.pt215.upgrade]` table)
or an internal error. A file that cannot be read or parsed is a note on stderr and the scan goes on.

Codes (stable): one table, `pt215.upgrade.rules.RULES`; `--explain CODE` prints one, chapter 7 explains each.

Directories are walked recursively; `.venv`, `venv`, `_build`, `build`, `node_modules`, `__pycache__`,
`site-packages` and hidden directories other than CI and container folders (`.github`, `.gitlab`, `.circleci`,
`.buildkite`, `.lightning`, `.azure-pipelines`, `.ci`, `.jenkins`, `.devcontainer`, ...: `ci.CI_FOLDERS`) are skipped
unless named on the command line. `# noqa` silences every code on its line, `# noqa: PT1505` that code.
"""

from pt215.upgrade.cli import main
from pt215.upgrade.rules import ACC_POLICIES, FR_LEGACY, RULES, Finding, Rule
from pt215.upgrade.scanner import (
    Report,
    ScanError,
    admits,
    iter_files,
    kind_of,
    scan,
    scan_file,
    scan_paths,
    scan_text,
)

__all__ = ["RULES", "Rule", "Finding", "ScanError", "FR_LEGACY", "ACC_POLICIES", "Report", "scan_text",
           "scan_file", "scan_paths", "scan", "iter_files", "kind_of", "admits", "main"]
