"""Measure `python -m pt215.upgrade` on five public FSDP2 code bases: precision per rule, and recall of known spots.

    .venv/bin/python scripts/measure_upgrade_precision.py --root /tmp/repos

`--root` holds one work tree per repository in `data/07-upgrading/repos.json` (named as there), each exported at
the commit recorded there:

    git --git-dir=<bare clone> archive <commit> | tar -x -C <root>/<name>

Every finding is joined with its hand label in `data/07-upgrading/labels.csv` (real / false, with the reason,
from reading the code). Writes `data/07-upgrading/findings.csv` (every finding with its label) and
`data/07-upgrading/precision.json` (per rule and per repository; the recall spots found or missed) and
`data/07-upgrading/precision_table.csv` (the table chapter 7 shows). Exits 1 if a
finding has no label or a label has no finding, so the table never goes stale silently.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path

from pt215.upgrade import RULES, scan
from pt215.upgrade_rules import FAILING

DATA = Path(__file__).resolve().parents[1] / "data" / "07-upgrading"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="folder with one exported work tree per repository")
    ap.add_argument("--data", default=str(DATA), help="where repos.json and labels.csv live (default: the book's)")
    args = ap.parse_args(argv)
    data = Path(args.data)
    root = Path(args.root)
    repos = json.loads((data / "repos.json").read_text())
    missing = [r["name"] for r in repos["repos"] if not (root / r["name"]).is_dir()]
    if missing:
        ap.error(f"--root: no work tree for {', '.join(missing)} under it (export each at its commit, see --help)")
    with open(data / "labels.csv", newline="") as fh:
        labels = {(r["repo"], r["path"], int(r["line"]), r["code"]): r for r in csv.DictReader(fh)}

    rows, files_scanned = [], {}
    for repo in repos["repos"]:
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
    unlabelled = [r for r in rows if r["label"] not in ("real", "false")]
    seen = {(r["repo"], r["path"], r["line"], r["code"]) for r in rows}
    stale = [k for k in labels if k not in seen]

    per_rule = []
    for code, rule in RULES.items():
        mine = [r for r in rows if r["code"] == code]
        real = sum(r["label"] == "real" for r in mine)
        per_rule.append({"code": code, "severity": rule.severity, "summary": rule.summary, "findings": len(mine),
                         "real": real, "false": sum(r["label"] == "false" for r in mine),
                         "precision": round(real / len(mine), 3) if mine else None})
    failing = [r for r in rows if r["severity"] in FAILING]
    recall = []
    for spot in repos["recall"]:
        hit = any(r["repo"] == spot["repo"] and r["path"] == spot["path"] and r["line"] == spot["line"]
                  and r["code"] == spot["code"] for r in rows)
        recall.append({**spot, "found": hit})
    out = {
        "command": "python scripts/measure_upgrade_precision.py --root <folder with the five work trees>",
        "repos": [{**r, "files_scanned": files_scanned[r["name"]],
                   "findings": sum(x["repo"] == r["name"] for x in rows)} for r in repos["repos"]],
        "per_rule": per_rule,
        "failing": {"findings": len(failing), "real": sum(r["label"] == "real" for r in failing),
                    "precision": round(sum(r["label"] == "real" for r in failing) / len(failing), 3)
                    if failing else None},
        "all": {"findings": len(rows), "real": sum(r["label"] == "real" for r in rows)},
        "recall": recall,
        "by_code": dict(Counter(r["code"] for r in rows)),
    }
    (data / "precision.json").write_text(json.dumps(out, indent=1) + "\n")
    with open(data / "precision_table.csv", "w", newline="") as fh:  # what chapter 7's page includes
        w = csv.writer(fh)
        w.writerow(["code", "severity", "what it finds", "findings", "real", "false", "precision"])
        for r in per_rule:
            w.writerow([r["code"], r["severity"], r["summary"], r["findings"], r["real"], r["false"],
                        f"{r['precision']:.0%}" if r["precision"] is not None else "none found"])
        f = out["failing"]
        w.writerow(["all", "error + warning", "the findings that fail a run", f["findings"], f["real"],
                    f["findings"] - f["real"], f"{f['precision']:.0%}" if f["precision"] is not None else "-"])
    with open(data / "findings.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["repo"])
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} findings, {out['failing']['findings']} failing, precision of failing findings "
          f"{out['failing']['precision']}; recall spots found {sum(s['found'] for s in recall)}/{len(recall)}")
    for r in unlabelled:
        print(f"unlabelled: {r['repo']},{r['path']},{r['line']},{r['code']}  {r['message'][:90]}", file=sys.stderr)
    for k in stale:
        print(f"label without a finding: {k}", file=sys.stderr)
    return 1 if unlabelled or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
