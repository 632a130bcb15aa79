"""Measure `python -m pt215.upgrade` on public code bases: act-precision per rule, and recall of pre-written spots.

    .venv/bin/python scripts/measure_upgrade_precision.py --root /tmp/repos

`--root` holds one work tree per repository in `data/07-upgrading/repos.json` (named as there), each exported at
the commit recorded there (see `data/07-upgrading/README.md`). Every finding is joined with its label in
`data/07-upgrading/labels.csv`:

- **act**: a change or a check the team must make for 2.15;
- **noise**: a true statement with nothing to do;
- **wrong**: not true of the code;

each with a reason specific to the spot. The act-precision the chapter publishes is act / failing (error and
warning) findings, per rule and overall. Recall is measured against `data/07-upgrading/spots.json`, the places a
2.15 upgrade must touch, written down from reading each code base before the run: a spot is found when a finding
of its code is reported in its file at one of its lines.

Writes `findings.csv` (every finding with its label), `precision.json` (per rule, per repository, the spots found
or missed) and `precision_table.csv` (the table chapter 7 shows), in `data/07-upgrading/`. Exits 1 if a finding
has no label or a label no longer has a finding, so the table never goes stale silently.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path

from pt215.upgrade import RULES, scan
from pt215.upgrade.rules import FAILING

DATA = Path(__file__).resolve().parents[1] / "data" / "07-upgrading"
LABELS = ("act", "noise", "wrong")


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "-"


def measure(root: Path, data: Path) -> tuple[dict, list[dict], list[str]]:
    """Scan every repository; (results, rows, problems) where problems are unlabelled findings and stale labels."""
    repos = json.loads((data / "repos.json").read_text())["repos"]
    spots = json.loads((data / "spots.json").read_text())["spots"]
    with open(data / "labels.csv", newline="") as fh:
        labels = {(r["repo"], r["path"], int(r["line"]), r["code"]): r for r in csv.DictReader(fh)}
    rows, files_scanned = [], {}
    for repo in repos:
        name = repo["name"]
        report = scan([root / name])
        files_scanned[name] = report.n_files
        for f in report.findings:
            rel = Path(f.path).relative_to(root / name).as_posix()
            where = rel if f.cell is None else f"{rel}#cell{f.cell}"
            lab = labels.get((name, where, f.line, f.code))
            rows.append({"repo": name, "path": where, "line": f.line, "code": f.code, "severity": f.severity,
                         "label": lab["label"] if lab else "", "reason": lab["reason"] if lab else "",
                         "message": f.message})
    problems = [f"unlabelled: {r['repo']},{r['path']},{r['line']},{r['code']}  {r['message'][:90]}"
                for r in rows if r["label"] not in LABELS]
    seen = {(r["repo"], r["path"], r["line"], r["code"]) for r in rows}
    problems += [f"label without a finding: {k}" for k in labels if k not in seen]

    per_rule = []
    for code, rule in RULES.items():
        mine = [r for r in rows if r["code"] == code]
        n = Counter(r["label"] for r in mine)
        failing = rule.severity in FAILING
        per_rule.append({"code": code, "severity": rule.severity, "summary": rule.summary, "findings": len(mine),
                         "act": n["act"], "noise": n["noise"], "wrong": n["wrong"],
                         "act_precision": _ratio(n["act"], len(mine)) if failing else None})
    failing_rows = [r for r in rows if r["severity"] in FAILING]
    nf = Counter(r["label"] for r in failing_rows)
    recall = []
    for spot in spots:
        hit = any(r["repo"] == spot["repo"] and r["path"] == spot["path"] and r["line"] in spot["lines"]
                  and r["code"] == spot["code"] for r in rows)
        recall.append({**spot, "found": hit})
    results = {
        "command": "python scripts/measure_upgrade_precision.py --root <folder with one work tree per repository>",
        "labels": "act: a change or check to make for 2.15; noise: true, nothing to do; wrong: not true",
        "repos": [{**r, "files_scanned": files_scanned[r["name"]],
                   "findings": sum(x["repo"] == r["name"] for x in rows),
                   "failing": sum(x["repo"] == r["name"] and x["severity"] in FAILING for x in rows)}
                  for r in repos],
        "per_rule": per_rule,
        "failing": {"findings": len(failing_rows), "act": nf["act"], "noise": nf["noise"], "wrong": nf["wrong"],
                    "act_precision": _ratio(nf["act"], len(failing_rows))},
        "all": {"findings": len(rows), **{k: sum(r["label"] == k for r in rows) for k in LABELS}},
        "recall": {"spots": len(recall), "found": sum(s["found"] for s in recall),
                   "recall": _ratio(sum(s["found"] for s in recall), len(recall)), "spots_list": recall},
    }
    return results, rows, problems


def write(data: Path, results: dict, rows: list[dict]) -> None:
    (data / "precision.json").write_text(json.dumps(results, indent=1) + "\n")
    with open(data / "precision_table.csv", "w", newline="") as fh:  # what chapter 7's page includes
        w = csv.writer(fh)
        w.writerow(["code", "severity", "what it finds", "findings", "act", "noise", "wrong", "act-precision"])
        for r in results["per_rule"]:
            if not r["findings"]:
                continue
            prec = _pct(r["act_precision"]) if r["severity"] in FAILING else "info: never fails a run"
            w.writerow([r["code"], r["severity"], r["summary"], r["findings"], r["act"], r["noise"], r["wrong"], prec])
        f = results["failing"]
        w.writerow(["all", "error + warning", "the findings that fail a run", f["findings"], f["act"], f["noise"],
                    f["wrong"], _pct(f["act_precision"])])
    with open(data / "findings.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["repo", "path", "line", "code", "severity", "label", "reason", "message"])
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="folder with one exported work tree per repository")
    ap.add_argument("--data", default=str(DATA), help="where repos.json, spots.json and labels.csv live")
    args = ap.parse_args(argv)
    data, root = Path(args.data), Path(args.root)
    repos = json.loads((data / "repos.json").read_text())["repos"]
    missing = [r["name"] for r in repos if not (root / r["name"]).is_dir()]
    if missing:
        ap.error(f"--root: no work tree for {', '.join(missing)} under it (export each at its commit, see --help)")
    results, rows, problems = measure(root, data)
    write(data, results, rows)
    f, rc = results["failing"], results["recall"]
    print(f"{len(rows)} findings, {f['findings']} failing: {f['act']} act, {f['noise']} noise, {f['wrong']} wrong; "
          f"act-precision {_pct(f['act_precision'])}; recall {rc['found']}/{rc['spots']} ({_pct(rc['recall'])})")
    for r in results["per_rule"]:
        if r["findings"] and r["severity"] in FAILING:
            print(f"  {r['code']} [{r['severity']}] {r['act']}/{r['findings']} act ({_pct(r['act_precision'])})")
    for s in rc["spots_list"]:
        if not s["found"]:
            print(f"  missed: {s['code']} {s['repo']}/{s['path']}:{s['lines']}  {s['what']}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
