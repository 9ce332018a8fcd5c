"""Print every stored suite's verdicts, check by check, as tab-separated lines.

Replays the stored cells of each substrate (analysis/render/substrates.py, `SUITES`) for every
notebook and prints one line per check and substrate: notebook, substrate, the finding's
outcome there, the check's claim, its outcome, measured value and noise band. Nothing is
measured, no engine started.

Used to compare two versions of the rules or the code: run it in each checkout and diff the
outputs (`diff before.tsv after.tsv`), or pass `--join BEFORE.tsv` to print a before/after
table of the outcomes that changed and a count of those that did not.

    python scripts/verdict_table.py > after.tsv
    python scripts/verdict_table.py --join before.tsv
"""

from __future__ import annotations

import argparse
import csv
import sys

FIELDS = ("notebook", "substrate", "finding", "claim", "outcome", "measured", "noise")


def rows() -> list[dict]:
    from specrepro.analysis.render.substrates import SUITES, compare
    from specrepro.analysis.verdict.claims import claims_for
    from specrepro.params.schema import NOTEBOOK_IDS

    out = []
    for nb in NOTEBOOK_IDS:
        cmp = compare(nb, claims_for(nb), SUITES)
        for sub in cmp.substrates:
            for c in sub.checks or []:
                out.append({"notebook": nb, "substrate": sub.ref.params,
                            "finding": sub.outcome or sub.status, "claim": c.claim,
                            "outcome": c.outcome, "measured": " ".join(c.measured.split()),
                            "noise": getattr(c, "noise", "")})
            if not sub.checks:
                out.append({"notebook": nb, "substrate": sub.ref.params,
                            "finding": sub.status, "claim": "", "outcome": sub.status,
                            "measured": sub.why, "noise": ""})
    return out


def join(before_path: str, after: list[dict]) -> None:
    with open(before_path, newline="") as fh:
        before = {(r["notebook"], r["substrate"], r["claim"]): r
                  for r in csv.DictReader(fh, delimiter="\t")}
    same = changed = 0
    print("| notebook | substrate | check | before | after |")
    print("| --- | --- | --- | --- | --- |")
    seen = set()
    for r in after:
        key = (r["notebook"], r["substrate"], r["claim"])
        seen.add(key)
        b = before.get(key)
        old = b["outcome"] if b else "(no such check)"
        if old == r["outcome"]:
            same += 1
            continue
        changed += 1
        print(f"| {r['notebook'][:2]} | {r['substrate'].split('/')[-1]} | {r['claim']} | "
              f"{old} | {r['outcome']} |")
    for key, b in before.items():
        if key not in seen:
            changed += 1
            print(f"| {key[0][:2]} | {key[1].split('/')[-1]} | {key[2]} | {b['outcome']} | "
                  "(no such check) |")
    print(f"\n{same} checks unchanged, {changed} changed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--join", metavar="BEFORE_TSV",
                    help="print the changes against an earlier output of this script")
    args = ap.parse_args(argv)
    out = rows()
    if args.join:
        join(args.join, out)
        return 0
    w = csv.DictWriter(sys.stdout, FIELDS, delimiter="\t", lineterminator="\n")
    w.writeheader()
    w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
