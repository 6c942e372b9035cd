#!/usr/bin/env python3
"""The current results table of docs/performance.md, made from benchmarks/results/*.json.

    python benchmarks/results_table.py            # print the table (Markdown)
    python benchmarks/results_table.py replay     # the replayed GPU step's table

Each results file holds one benchmark setting: either ``rows`` (one per case, as transcribed or
written by hand) or ``runs`` (the JSON that ``bench_pushpull.py --out`` writes, each with a
``label`` and the ``commit`` it ran at). A new measurement replaces its file's row; the test
suite checks that the page shows exactly this table.
"""
import argparse
import glob
import json
import os
from typing import Dict, Iterator, List

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
HEADER = ("| benchmark | case | topology, van, settings | MXNet dist_sync | dist_byteps "
          "| ratio | of the bound | worker CPU a round: MXNet; ours | when, commit, load |\n"
          "|---|---|---|---|---|---|---|---|---|")
CASES = {"resnet50": "(a) ResNet-50 grads", "big": "(b) 1 x 100 MB", "small": "(c) 1000 x 4 KB"}


def _ms(value) -> str:
    return "-" if value is None else "%.1f ms" % value


def _cpu(upstream, ours) -> str:
    """One worker's CPU seconds (user + system) a round, MXNet's C++ worker's and ours, where
    the run measured both."""
    if upstream is None or ours is None:
        return "-"
    return "%.3f; %.3f s" % (upstream, ours)


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
                   "byteps_bound_pct": _bound_pct(run),
                   "worker_cpu": _cpu(run["upstream"].get("worker_cpu_s"),
                                      run["byteps"].get("worker_cpu_s")),
                   "date": run_set["date"], "commit": run_set["commit"],
                   "load": "%.2f -> %.2f" % tuple(run_set["load_before_after"])}


def _bound_pct(run: Dict):
    """dist_byteps's step as a share of the link bound, where the run measured the link."""
    ours = run["byteps"].get("median_s")
    if not run.get("link_bound_s") or not ours:
        return None
    return round(100 * run["link_bound_s"] / ours)


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
    return "| %s, %s | %s | %s, %s | %s | %s | %s | %s | %s | %s, %s, load %s |" % (
        row["benchmark"], row["network"].split(",")[0], row["case"], row["topology"],
        row["van"], upstream, ours, ratio, bound, row.get("worker_cpu", "-"), row["date"],
        row["commit"], row["load"])


REPLAY = os.path.join(RESULTS, "replay")
REPLAY_HEADER = ("| model, compute per step | workers x servers, dist_byteps settings "
                 "| S / rate, a step's bytes on bare sockets | MXNet dist_sync | gloo all-reduce "
                 "| plain-socket PS | dist_byteps | vs dist_sync, vs gloo "
                 "| dist_byteps of the bound (of TCP's) | CPU per step, worker / server: "
                 "MXNet; ours | when, commit, load |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|")
MODEL_NAMES = {"resnet50_v1": "ResNet-50", "vgg16": "VGG-16", "bert_base": "BERT-base"}


def replay_row(data: Dict) -> str:
    """The replay table's row of one ``bench_replay.py --out`` file."""
    systems = data["systems"]

    def step(name):
        return "%.2f s" % systems[name]["step_s"] if name in systems else "-"

    def ratio(name):
        if name in systems and "dist_byteps" in systems:
            return "%.2fx" % (systems[name]["step_s"] / systems["dist_byteps"]["step_s"])
        return "-"

    def cpu(name):
        roles = systems.get(name, {}).get("roles", {})
        if "worker" not in roles or "server" not in roles:
            return "-"
        return "%.2f / %.2f s" % (roles["worker"]["cpu_s"], roles["server"]["cpu_s"])

    compute, link = data["compute_s"], data.get("link_bound_s")
    case = "%s %s, %.2f s" % (MODEL_NAMES.get(data["model"], data["model"]), data["dtype"],
                              compute)
    if link:
        case += " (%g x S / rate)" % round(compute / link, 2)
    mesh = data.get("mesh_s")
    tight = max(compute, mesh) if mesh else None
    ours = systems.get("dist_byteps")
    share = "-"
    if ours:
        share = "%.0f%%" % (100 * data["bound_s"] / ours["step_s"])
        if tight:
            share += " (%.0f%%)" % (100 * tight / ours["step_s"])
    bounds = ("%.2f s, %.2f s" % (link, mesh) if link and mesh else "-")
    cells = "| %s | %dx%d, %s | %s | %s | %s | %s | %s | %s, %s | %s | %s; %s | %s, %s, load %s |"
    return cells % (
        case, data["workers"], data["servers"], data["settings"].replace("dist_byteps ", ""),
        bounds, step("dist_sync"), step("gloo"), step("plain"), step("dist_byteps"),
        ratio("dist_sync"), ratio("gloo"), share, cpu("dist_sync"), cpu("dist_byteps"),
        data["date"], data["commit"], data["load"])


def replay_table() -> str:
    """The replay table of docs/performance.md: a row per file of benchmarks/results/replay/."""
    lines = [REPLAY_HEADER]
    for path in sorted(glob.glob(os.path.join(REPLAY, "*.json"))):
        with open(path) as source:
            lines.append(replay_row(json.load(source)))
    return "\n".join(lines) + "\n"


def table() -> str:
    """The Markdown table of every results file, in file-name order."""
    lines: List[str] = [HEADER]
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path) as source:
            lines += [_line(row) for row in _rows_of(json.load(source))]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n")[0])
    parser.add_argument("table", nargs="?", choices=["replay"],
                        help="replay: the replayed GPU step's table (default: the results table)")
    print(replay_table() if parser.parse_args().table == "replay" else table(), end="")
