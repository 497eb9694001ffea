"""Tables from Nsight Compute's source page (``ncu --import REPORT --page source --print-source
sass --csv``, as ``early_check_gpu.sh ncu_source`` writes it, one file a kernel name): for each
launch in the file, where its warps' stall samples went (by reason), its hottest instructions
with their two main reasons, and its executed instruction mix by opcode.

    python3 benchmarks/ncu_source_summary.py FILE.csv [--launch N] [--hot 20] [--mix 15]
"""

from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def launches(path: str) -> list[dict]:
    """Each launch's header and instruction rows (a file holds one or more launches)."""
    out: list[dict] = []
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if row and row[0] == "Kernel Name":
                out.append({"name": row[1], "rows": []})
            elif row and row[0] == "Address" and out:
                out[-1]["header"] = row
            elif out and len(row) > 5:
                out[-1]["rows"].append(row)
    return out


def _int(value: str) -> int:
    return int(value) if value not in ("", "-") else 0


def summary(launch: dict, hot: int, mix: int) -> None:
    col = {h: i for i, h in enumerate(launch["header"])}
    reasons = [h for h in launch["header"] if h.startswith("stall_") and "(Not Issued)" not in h]
    rows = launch["rows"]
    samples = sum(_int(r[col[SAMPLES]]) for r in rows)
    executed = sum(_int(r[col[EXECUTED]]) for r in rows)
    print(f"\n{launch['name']}: {len(rows)} instructions, {samples} stall samples, "
          f"{executed} warp instructions executed")
    print("\n| stall reason | samples | share |\n|---|---|---|")
    totals = {r: sum(_int(row[col[r]]) for row in rows) for r in reasons}
    for reason, n in sorted(totals.items(), key=lambda kv: -kv[1])[:8]:
        print(f"| {reason} | {n} | {100 * n / max(samples, 1):.1f} % |")
    print("\n| # | samples | executed | instruction | main reasons |\n|---|---|---|---|---|")
    order = sorted(range(len(rows)), key=lambda i: -_int(rows[i][col[SAMPLES]]))[:hot]
    for i in sorted(order):
        r = rows[i]
        top = sorted(((_int(r[col[x]]), x) for x in reasons), reverse=True)[:2]
        why = ", ".join(f"{x[len('stall_'):]} {n}" for n, x in top if n)
        print(f"| {i} | {_int(r[col[SAMPLES]])} | {_int(r[col[EXECUTED]])} | "
              f"`{r[1].strip()[:56]}` | {why} |")
    ops: collections.Counter = collections.Counter()
    for r in rows:
        text = r[1].strip()
        if text.startswith("@"):
            text = text.split(None, 1)[1]
        ops[text.split()[0]] += _int(r[col[EXECUTED]])
    print("\n| opcode | warp instructions | share |\n|---|---|---|")
    for op, n in ops.most_common(mix):
        print(f"| {op} | {n} | {100 * n / max(executed, 1):.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--launch", type=int, default=None, help="only this launch (0-based)")
    ap.add_argument("--hot", type=int, default=20)
    ap.add_argument("--mix", type=int, default=15)
    args = ap.parse_args()
    found = launches(args.file)
    for i, launch in enumerate(found):
        if args.launch is None or i == args.launch:
            summary(launch, args.hot, args.mix)


if __name__ == "__main__":
    main()
