#!/usr/bin/env python3
"""The current results table of docs/performance.md, made from benchmarks/results/*.json.

    python benchmarks/results_table.py            # print the table (Markdown)

Each results file holds one benchmark setting: either ``rows`` (one per case, as transcribed or
written by hand) or ``runs`` (the JSON that ``bench_pushpull.py --out`` writes, each with a
``label`` and the ``commit`` it ran at). A new measurement replaces its file's row; the test
suite checks that the page shows exactly this table.
"""
import glob
import json
import os
from typing import Dict, Iterator, List

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
HEADER = ("| benchmark | case | topology, van, settings | MXNet dist_sync | dist_byteps "
          "| ratio | of the bound | when, commit, load |\n"
          "|---|---|---|---|---|---|---|---|")
CASES = {"resnet50": "(a) ResNet-50 grads", "big": "(b) 1 x 100 MB", "small": "(c) 1000 x 4 KB"}


def _ms(value) -> str:
    return "-" if value is None else "%.1f ms" % value


def _rows_of(data: Dict) -> Iterator[Dict]:
    if "rows" in data:
        for row in data["rows"]:
            yield dict(row, benchmark=data["benchmark"], network=data["network"])
        return
    for run_set in data["runs"]:                       # bench_pushpull.py --out files
        for run in run_set["runs"]:
            yield {"benchmark": "pushpull", "network": run_set["network"],
                   "case": CASES.get(run["case"], run["case"]),
                   "topology": "%dx%d" % (run["workers"], run["servers"]),
                   "van": "%s, %s" % (run_set["van"], run_set["label"]),
                   "upstream_ms": run["upstream"].get("median_s", 0) * 1000 or None,
                   "byteps_ms": (run["byteps"].get("median_s") or 0) * 1000 or None,
                   "byteps_status": run["byteps"]["status"],
                   "date": run_set["date"], "commit": run_set["commit"],
                   "load": "%.2f -> %.2f" % tuple(run_set["load_before_after"])}


def _line(row: Dict) -> str:
    if row["benchmark"] == "training":
        upstream, ours = "%.2f steps/s" % row["upstream_steps_s"], \
            "%.2f steps/s" % row["byteps_steps_s"]
        ratio = row.get("ratio_range") or "%.2fx" % (row["byteps_steps_s"]
                                                      / row["upstream_steps_s"])
    else:
        upstream, ours = _ms(row.get("upstream_ms")), _ms(row.get("byteps_ms"))
        if row.get("byteps_status", "ok") != "ok":
            ours = row["byteps_status"]          # e.g. timeout: the job ran past its limit
        if row.get("ratio") is not None:
            ratio = "%.2fx" % row["ratio"]
        elif row.get("upstream_ms") and row.get("byteps_ms"):
            ratio = "%.2fx" % (row["upstream_ms"] / row["byteps_ms"])
        else:
            ratio = "-"
    bound = "-" if row.get("byteps_bound_pct") is None else "%g%%" % row["byteps_bound_pct"]
    if row.get("ceiling_pct"):
        bound += " (ceiling %s%%)" % row["ceiling_pct"]
    return "| %s, %s | %s | %s, %s | %s | %s | %s | %s | %s, %s, load %s |" % (
        row["benchmark"], row["network"].split(",")[0], row["case"], row["topology"],
        row["van"], upstream, ours, ratio, bound, row["date"], row["commit"], row["load"])


def table() -> str:
    """The Markdown table of every results file, in file-name order."""
    lines: List[str] = [HEADER]
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path) as source:
            lines += [_line(row) for row in _rows_of(json.load(source))]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
