#!/usr/bin/env python3
"""Push/pull throughput of ``dist_byteps`` against upstream MXNet ``dist_sync``, same machine.

    python benchmarks/bench_pushpull.py                     # every case and topology (~10 min)
    python benchmarks/bench_pushpull.py --quick             # small sizes, a smoke run
    python benchmarks/bench_pushpull.py --cases resnet50 --topologies 2x2 --iters 5
    python benchmarks/bench_pushpull.py --network netns     # emulated 1 Gbit/s links (root)

For each case and topology (workers x servers) the same worker script
(``benchmarks/_pushpull_worker.py``) runs twice through ``launch.py`` on 127.0.0.1 over TCP
(``DMLC_LOCAL`` removed from the environment, so neither side may use ipc):

* ``kvstore=dist_sync`` with MXNet's scheduler and C++ servers (``--scheduler mxnet --server mxnet``);
* ``kvstore=dist_byteps`` with our scheduler and our servers (``--server byteps-knob``), or with
  MXNet's servers if ours do not answer the BytePS probe (said in the output).

With ``--network netns`` every node runs on a host of its own in the launcher's emulated network
(``launch.py --launcher netns``: network namespaces, links shaped to ``--link-rate`` in both
directions), default topologies 4x4 and 4x2. The link's real TCP rate is measured in the same
run, and each row also gives the link bound of a parameter server and each side's fraction of
it: a worker sends and receives the model size S per step (full duplex), so the bound is
S / rate with at least as many servers as workers, and W x S / (servers x rate), a server's
link, otherwise.

Cases: ``resnet50`` (the gradient set of gluon's resnet50_v1, 193 arrays, 102.3 MB fp32),
``big`` (one 100 MB tensor), ``small`` (1000 tensors of 4 KB). The time of one iteration is the
slowest worker's. Each side runs ``--repeats`` times, alternating with the other so both see
the same background load; the table shows each side's lowest median, and the ratio upstream
time / byteps time (> 1: we are faster). Results also go to a JSON file next to the PNG plot.
"""
import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GLOO_WORKER = os.path.join(ROOT, "benchmarks", "_gloo_worker.py")
WORKER = os.path.join(HERE, "_pushpull_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
RESULT_RE = re.compile(r"^\[worker \d+\] BENCH_RESULT (\{.*\})$")
SMALL_BYTES = 4096
BIG_ELEMS = 25 * 1000 * 1000


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    label: str
    warmup: int
    iters: int
    netns_target: Optional[float]   # the goal ratio on emulated 1 Gbit/s links (None: none)
    quick_label: str = ""
    #: the goal ratio on loopback (at least as fast as upstream on every case)
    loopback_target: float = 1.0

    def target(self, network: str) -> Optional[float]:
        """The goal ratio to upstream on ``network`` (loopback or netns)."""
        return self.netns_target if network == "netns" else self.loopback_target

    def title(self, quick: bool) -> str:
        """The row label: with --quick, what was really sent."""
        return self.quick_label if quick else self.label


CASES = {c.name: c for c in (
    Case("resnet50", "(a) ResNet-50 grads", warmup=3, iters=20, netns_target=1.15,
         quick_label="(a) ResNet-50's first 40 grads"),
    Case("big", "(b) 1 x 100 MB", warmup=3, iters=20, netns_target=2.0,
         quick_label="(b) 1 x 4 MB"),
    Case("small", "(c) 1000 x 4 KB", warmup=5, iters=30, netns_target=None,
         quick_label="(c) 100 x 4 KB"),
)}


@dataclasses.dataclass
class Run:
    """The outcome of one launched job."""

    kvstore: str
    server: str                     # launch.py --server
    status: str = "ok"              # ok, failed (rc N), timeout, wrong sums
    median_s: Optional[float] = None
    flavor: str = ""
    mode: str = ""
    detail: str = ""
    #: a worker's CPU seconds (user + system) per timed iteration, refill included, mean over
    #: the workers: on a machine whose cores are all busy this is what sets the speed
    worker_cpu_s: Optional[float] = None


def resnet50_shapes() -> List[Tuple[int, ...]]:
    """Shapes of resnet50_v1's trainable parameters (built and initialised offline)."""
    import mxnet as mx
    net = mx.gluon.model_zoo.vision.resnet50_v1()
    net.initialize()
    net(mx.nd.zeros((1, 3, 224, 224)))   # resolves the deferred (BatchNorm) shapes
    return [p.shape for p in net.collect_params().values() if p.grad_req != "null"]


def case_shapes(name: str, quick: bool) -> List[Tuple[int, ...]]:
    """The tensors of one case; ``quick`` shrinks each case to a few MB."""
    if name == "resnet50":
        shapes = resnet50_shapes()
        return shapes[:40] if quick else shapes
    if name == "big":
        return [(BIG_ELEMS // 25 if quick else BIG_ELEMS,)]
    return [(SMALL_BYTES // 4,)] * (100 if quick else 1000)


def child_env() -> Dict[str, str]:
    """Our environment minus anything that would let ps-lite pick ipc or change the layout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "PS_", "BYTEPS_", "MXNET_KVSTORE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


#: launch.py options of the network the jobs run on (set by main from --network).
NETWORK_OPTIONS: List[str] = []
#: launch.py options of the dist_byteps jobs only (set by main from --van).
BYTEPS_OPTIONS: List[str] = []
#: worker arguments of the dist_byteps jobs only (e.g. --compression JSON)
BYTEPS_WORKER_OPTIONS: List[str] = []


def launch(workers: int, servers: int, kvstore: str, server: str, shapes_file: str,
           warmup: int, iters: int, mode: str, timeout: float) -> Tuple[int, str]:
    """Run one job through launch.py; returns (exit status, combined output)."""
    scheduler = "mxnet" if kvstore == "dist_sync" else "byteps"
    ours = BYTEPS_OPTIONS if kvstore != "dist_sync" else []
    ours_worker = BYTEPS_WORKER_OPTIONS if kvstore != "dist_sync" else []
    argv = [sys.executable, LAUNCH, "-n", str(workers), "-s", str(servers), *NETWORK_OPTIONS,
            *ours,
            "--scheduler", scheduler, "--server", server, "--timeout", str(timeout),
            "--grace", "20", sys.executable, WORKER, "--kvstore", kvstore,
            "--shapes", shapes_file, "--warmup", str(warmup), "--iters", str(iters),
            "--mode", mode, *ours_worker]
    try:
        proc = subprocess.run(argv, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout + 30)
    except subprocess.TimeoutExpired as exc:    # launch.py itself hung past its own timeout
        return 124, (exc.stdout or b"").decode(errors="replace")
    return proc.returncode, proc.stdout.decode(errors="replace")


def summarise(run: Run, rc: int, output: str, workers: int) -> Run:
    """Fill ``run`` from the workers' BENCH_RESULT lines."""
    results = [json.loads(m.group(1)) for m in map(RESULT_RE.match, output.splitlines()) if m]
    wrong = [r for r in results if r["check"]["wrong_tensors"]]
    if wrong:
        check = wrong[0]["check"]
        run.status = "wrong sums"
        run.detail = "%d tensors wrong, e.g. %s instead of %s" % (
            check["wrong_tensors"], check["first_wrong_value"], check["expected"])
    elif rc != 0 or len(results) != workers:
        run.status = "timeout" if rc == 124 else "failed (rc %d)" % rc
        run.detail = "\n".join(output.splitlines()[-8:])
    if results:
        # one iteration lasts until its slowest worker is done
        per_iter = [max(times) for times in zip(*(r["times_s"] for r in results))]
        run.median_s = statistics.median(per_iter)
        run.flavor, run.mode = results[0]["flavor"], results[0]["mode"]
        cpu = [r["cpu_user_s"] + r["cpu_system_s"] for r in results if "cpu_user_s" in r]
        run.worker_cpu_s = statistics.mean(cpu) if cpu else None
    return run


def run_job(workers, servers, kvstore, server, shapes_file, case, args) -> Run:
    warmup = case.warmup if args.warmup is None else args.warmup
    iters = case.iters if args.iters is None else args.iters
    mode = args.upstream_mode if kvstore == "dist_sync" else "pushpull"
    rc, output = launch(workers, servers, kvstore, server, shapes_file, warmup, iters, mode,
                        args.job_timeout)
    run = summarise(Run(kvstore, server), rc, output, workers)
    if run.status == "wrong sums" and kvstore == "dist_sync" and mode == "pushpull":
        # MXNet's C++ server has a known race with pushpull: measure push + pull instead
        rc, output = launch(workers, servers, kvstore, server, shapes_file, warmup, iters,
                            "push+pull", args.job_timeout)
        retry = summarise(Run(kvstore, server), rc, output, workers)
        retry.detail = "pushpull gave wrong sums (%s); measured push+pull" % run.detail
        run = retry
    return run


def probe_byteps_server(args) -> str:
    """``byteps-knob`` if our server answers the BytePS probe in a 1x1 job, else ``mxnet``."""
    if args.byteps_server != "auto":
        return args.byteps_server
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([[16]], f)
    try:
        rc, output = launch(1, 1, "dist_byteps", "byteps-knob", f.name, 0, 1, "pushpull", 60)
    finally:
        os.unlink(f.name)
    run = summarise(Run("dist_byteps", "byteps-knob"), rc, output, 1)
    if run.status == "ok" and run.flavor == "byteps":
        return "byteps-knob"
    print("NOTE: our server (launch.py --server byteps-knob) is not usable here (%s, flavor %r);"
          " dist_byteps runs against upstream MXNet servers (--server mxnet)."
          % (run.status, run.flavor or "?"), flush=True)
    return "mxnet"


def parse_topologies(text: str) -> List[Tuple[int, int]]:
    """``1x1,2x2`` -> [(1, 1), (2, 2)] (workers x servers)."""
    result = []
    for item in filter(None, text.split(",")):
        w, sep, s = item.partition("x")
        if not (sep and w.isdigit() and s.isdigit() and int(w) > 0 and int(s) > 0):
            raise argparse.ArgumentTypeError("topology %r: expected WORKERSxSERVERS" % item)
        result.append((int(w), int(s)))
    return result


def parse_cases(text: str) -> List[Case]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise argparse.ArgumentTypeError("unknown case(s) %s; choose from %s"
                                         % (unknown, ",".join(CASES)))
    return [CASES[n] for n in names]


def add_byteps_job_arguments(p: argparse.ArgumentParser, example: str) -> None:
    """``--van`` and ``--byteps-env``: the van and settings of the dist_byteps jobs only
    (also used by ``bench_training.py``)."""
    p.add_argument("--byteps-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the dist_byteps jobs only (repeatable), e.g. " + example)
    p.add_argument("--van", choices=["auto", "zmq", "byteps_tcp", "byteps_rdma"], default="auto",
                   help="DMLC_PS_VAN_TYPE of the dist_byteps jobs (default: not set, i.e. auto: "
                        "byteps_tcp between our nodes, zmq with MXNet's; byteps_tcp and "
                        "byteps_rdma need our servers: upstream MXNet only speaks zmq; "
                        "byteps_rdma uses the first RDMA device unless --byteps-env "
                        "BYTEPS_RDMA_DEVICE=<name> (soft: the in-host test provider)")


def check_byteps_env(p: argparse.ArgumentParser, items: Sequence[str]) -> None:
    """Stop with a usage error unless every ``--byteps-env`` item is NAME=VALUE."""
    for item in items:
        if "=" not in item:
            p.error("--byteps-env expects NAME=VALUE, got %r" % item)


def byteps_launch_options(van: str, items: Sequence[str]) -> List[str]:
    """launch.py options of the dist_byteps jobs: the van (auto: left unset, as users leave
    it), then each ``--byteps-env`` item."""
    options = [] if van == "auto" else ["--env", "DMLC_PS_VAN_TYPE=%s" % van]
    for item in items:
        options.extend(["--env", item])
    return options


def describe_byteps_jobs(van: str, items: Sequence[str]) -> str:
    """One line for the results: the van and settings (an auth key's value hidden)."""
    return "dist_byteps van %s%s" % (van, "".join(" " + e for e in masked(items)))


PLOT_EXTENSIONS = (".png", ".svg", ".pdf")


def output_paths(out: str) -> Tuple[str, str]:
    """(plot, results) paths for ``--out``: a plot with the .json next to it, or a .json with
    a .png next to it. ValueError for any other name."""
    stem, extension = os.path.splitext(out)
    if extension.lower() == ".json":
        return stem + ".png", out
    if extension.lower() in PLOT_EXTENSIONS:
        return out, stem + ".json"
    raise ValueError("--out %s: name the plot (%s) or the results (.json)"
                     % (out, ", ".join(PLOT_EXTENSIONS)))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=parse_cases, default=list(CASES.values()),
                   help="comma list of %s (default all)" % ",".join(CASES))
    p.add_argument("--topologies", type=parse_topologies,
                   help="comma list of WORKERSxSERVERS (default 1x1,1x2,2x1,2x2 on loopback, "
                        "4x4,4x2 on netns)")
    p.add_argument("--network", choices=["loopback", "netns"], default="loopback",
                   help="loopback: 127.0.0.1 (default); netns: the launcher's emulated network "
                        "(root), every node on its own host")
    p.add_argument("--link-rate", default="1gbit",
                   help="netns: link rate in each direction (default 1gbit)")
    p.add_argument("--iters", type=int, help="timed iterations (default: per case, 20-30)")
    p.add_argument("--warmup", type=int, help="warm-up iterations (default: per case, 3-5)")
    p.add_argument("--repeats", type=int,
                   help="jobs per side, alternating; the table keeps each side's lowest "
                        "median (default 2, with --quick 1)")
    p.add_argument("--quick", action="store_true", help="small sizes and few iterations")
    p.add_argument("--out", default=os.path.join("bench_out", "pushpull.png"),
                   help="the plot of the ratios (.png, .svg or .pdf), with a .json of the "
                        "results next to it; or the .json, with a .png next to it")
    p.add_argument("--job-timeout", type=float, default=180.0,
                   help="launch.py --timeout of every job, seconds (default 180)")
    p.add_argument("--upstream-mode", choices=["pushpull", "push+pull"], default="pushpull",
                   help="how the dist_sync worker talks (default pushpull; wrong sums retry "
                        "with push+pull)")
    p.add_argument("--byteps-server", choices=["auto", "byteps-knob", "mxnet"], default="auto",
                   help="servers for dist_byteps (auto: ours if they answer the probe)")
    p.add_argument("--compression", metavar="JSON",
                   help="gradient compression of the dist_byteps jobs (set_gradient_compression; "
                        "the inputs are constant per tensor, so onebit's sums stay exact and "
                        "are checked), e.g. '{\"compressor\": \"onebit\", \"scaling\": true}'")
    add_byteps_job_arguments(p, "BYTEPS_PARTITION_BYTES=384000")
    args = p.parse_args(argv)
    check_byteps_env(p, args.byteps_env)
    try:      # checked now: a bad name must not throw away a finished run's results
        args.plot_path, args.json_path = output_paths(args.out)
    except ValueError as exc:
        p.error(str(exc))
    if args.van in ("byteps_tcp", "byteps_rdma") and args.byteps_server == "mxnet":
        p.error("--van %s needs our servers (upstream MXNet servers only speak zmq)" % args.van)
    if args.topologies is None:
        args.topologies = parse_topologies("4x4,4x2" if args.network == "netns"
                                           else "1x1,1x2,2x1,2x2")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 2
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.quick:
        args.iters = 3 if args.iters is None else args.iters
        args.warmup = 1 if args.warmup is None else args.warmup
    return args


def best(runs: List[Run]) -> Run:
    """The repeat with the lowest median (the least disturbed by other processes); a failed
    repeat is never hidden: its status wins."""
    timed = sorted((r for r in runs if r.median_s is not None), key=lambda r: r.median_s)
    chosen = dataclasses.replace(timed[0] if timed else runs[0])
    failed = next((r for r in runs if r.status != "ok"), None)
    if failed is not None:
        chosen.status, chosen.detail = failed.status, failed.detail
    return chosen


def fmt_ms(run: Run) -> str:
    if run.median_s is None:
        return run.status.upper()
    text = "%.1f" % (run.median_s * 1e3)
    return text if run.status == "ok" else "%s (%s)" % (text, run.status.upper())


def ratio(upstream: Run, ours: Run) -> Optional[float]:
    if upstream.status != "ok" or ours.status != "ok":
        return None
    return upstream.median_s / ours.median_s


def link_bound_s(nbytes: int, workers: int, servers: int, rate: float) -> float:
    """Seconds per step a parameter server needs at least, links of ``rate`` bytes/s (full
    duplex): each worker sends and receives ``nbytes``; the servers' links share W x nbytes."""
    return nbytes * max(1.0, workers / servers) / rate


def table(rows, quick: bool = False, rate: Optional[float] = None,
          gloo: Optional[Dict[Tuple[str, int], Run]] = None) -> str:
    """Markdown table of (case, workers, servers, bytes, upstream Run, byteps Run) rows, with a
    worker's CPU per iteration on each side; with
    a measured link ``rate`` (bytes/s) also the link bound and each side's fraction of it; with
    ``gloo`` runs (keyed by case name and workers) the all-reduce anchor and our ratio to it."""
    head = ["case", "MB", "workers", "servers", "upstream ms/iter", "byteps ms/iter", "ratio",
            "upstream GB/s", "byteps GB/s", "worker CPU ms/iter: upstream; byteps"]
    if gloo:
        head += ["gloo all_reduce ms/iter", "vs gloo"]
    if rate:
        head += ["link bound ms", "upstream % of bound", "byteps % of bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, w, s, nbytes, up, ours in rows:
        r = ratio(up, ours)
        speed = ["%.2f" % (nbytes / x.median_s / 1e9) if x.median_s else "-" for x in (up, ours)]
        cpu = "; ".join("-" if x.worker_cpu_s is None else "%.1f" % (x.worker_cpu_s * 1e3)
                        for x in (up, ours))
        cells = [case.title(quick), "%.1f" % (nbytes / 1e6), str(w), str(s), fmt_ms(up),
                 fmt_ms(ours), "-" if r is None else "%.2fx" % r] + speed + [cpu]
        if gloo:
            anchor = gloo.get((case.name, w))
            vs = ratio(anchor, ours) if anchor is not None else None
            cells += [fmt_ms(anchor) if anchor is not None else "-",
                      "-" if vs is None else "%.2fx" % vs]
        if rate:
            bound = link_bound_s(nbytes, w, s, rate)
            cells += ["%.1f" % (bound * 1e3)] + [
                "%.0f%%" % (100 * bound / x.median_s) if x.median_s else "-" for x in (up, ours)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path: str, quick: bool = False, network: str = "loopback TCP",
         kind: str = "loopback") -> None:
    """Bar plot of the ratios, one group per case, one bar per topology."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(dict.fromkeys(r[0] for r in rows))
    topos = list(dict.fromkeys("%dx%d" % (r[1], r[2]) for r in rows))
    width = 0.8 / max(1, len(topos))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for j, topo in enumerate(topos):
        values = [next((ratio(r[4], r[5]) for r in rows if r[0] == c
                        and "%dx%d" % (r[1], r[2]) == topo), None) for c in cases]
        xs = [i + j * width for i in range(len(cases))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width,
                      label="%s workers x servers" % topo)
        ax.bar_label(bars, ["failed" if v is None else "%.2f" % v for v in values],
                     fontsize=7)
    for i, case in enumerate(cases):     # the goal for each case
        if case.target(kind) is not None:
            ax.hlines(case.target(kind), i - width / 2, i + width * (len(topos) - 0.5),
                      colors="gray", linestyles="dashed", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(topos) - 1) / 2 for i in range(len(cases))])
    ax.set_xticklabels(["%s\n(%s)" % (c.title(quick), "goal %gx" % c.target(kind)
                                       if c.target(kind) else "no goal") for c in cases])
    ax.set_ylabel("upstream dist_sync time / dist_byteps time")
    ax.set_title("push/pull, %s (> 1: dist_byteps faster)" % network)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def masked(items: Sequence[str]) -> List[str]:
    """Command-line words with a BYTEPS_AUTH_KEY's value hidden (results get shared)."""
    return [re.sub(r"(BYTEPS_AUTH_KEY=).*", r"\1***", item) for item in items]


def write_json(rows, path: str, byteps_server: str, args) -> None:
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
            "load_before_after": args.loads,
            "command": " ".join(masked(sys.argv)), "byteps_server": byteps_server, "quick": args.quick,
            "repeats": args.repeats, "network": args.network, "van": args.van,
            "byteps_env": masked(args.byteps_env), "compression": args.compression,
            "link_rate_bytes_per_s": args.measured_rate, "gloo_allreduce": args.gloo_note,
            "gloo_runs": [{"case": c, "workers": w, **dataclasses.asdict(r)}
                          for (c, w), r in sorted(getattr(args, "gloo_runs", {}).items())],
            "runs": [{"case": c.name, "workers": w, "servers": s, "bytes": b,
                      "upstream": dataclasses.asdict(u), "byteps": dataclasses.asdict(o),
                      "link_bound_s": (link_bound_s(b, w, s, args.measured_rate)
                                       if args.measured_rate else None)}
                     for c, w, s, b, u, o in rows]}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def require_bench_extra() -> None:
    """Stop, naming the install command, unless the bench extra (tqdm, matplotlib) is there:
    checked after the command line is parsed, so ``--help`` works without it."""
    missing = []
    for module in ("tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        sys.exit("%s: needs %s: pip install -e '.[bench]'"
                 % (os.path.basename(sys.argv[0]), " and ".join(missing)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    require_bench_extra()
    from tqdm import tqdm
    args.loads = [os.getloadavg()[0]]
    print("machine: %d cpus, load average %.2f (other processes skew the times)"
          % (os.cpu_count(), args.loads[0]), flush=True)
    args.measured_rate, network = None, "loopback TCP"
    if args.network == "netns":
        args.measured_rate = measure_links(args.link_rate)
        NETWORK_OPTIONS[:] = ["--launcher", "netns", "--link-rate", args.link_rate]
        network = "emulated %s links (%.1f MB/s measured)" % (args.link_rate,
                                                              args.measured_rate / 1e6)
    BYTEPS_OPTIONS[:] = byteps_launch_options(args.van, args.byteps_env)
    network += "; " + describe_byteps_jobs(args.van, args.byteps_env)
    if args.compression:
        BYTEPS_WORKER_OPTIONS[:] = ["--compression", args.compression]
        network += "; dist_byteps compression %s" % args.compression
    args.gloo_note = gloo_note()
    byteps_server = probe_byteps_server(args)
    jobs = [(c, w, s) for c in args.cases for w, s in args.topologies]
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp, \
            tqdm(total=2 * len(jobs) * args.repeats, unit="job", dynamic_ncols=True) as bar:
        gloo_runs: Dict[Tuple[str, int], Run] = {}
        for case, workers, servers in jobs:
            shapes_file = os.path.join(tmp, case.name + ".json")
            if not os.path.exists(shapes_file):
                with open(shapes_file, "w") as f:
                    json.dump(case_shapes(case.name, args.quick), f)
            with open(shapes_file) as f:
                nbytes = 4 * sum(_prod(s) for s in json.load(f))
            runs = {"dist_sync": [], "dist_byteps": []}
            for _ in range(args.repeats):     # alternate, so both sides see the same load
                for kvstore, server in (("dist_sync", "mxnet"), ("dist_byteps", byteps_server)):
                    bar.set_description("%s %dx%d %s" % (case.name, workers, servers, kvstore))
                    run = run_job(workers, servers, kvstore, server, shapes_file, case, args)
                    if run.detail:
                        notes.append("%s %dx%d %s: %s" % (case.name, workers, servers,
                                                          kvstore, run.detail))
                        tqdm.write(notes[-1])
                    runs[kvstore].append(run)
                    bar.update(1)
            rows.append((case, workers, servers, nbytes, best(runs["dist_sync"]),
                         best(runs["dist_byteps"])))
            if args.gloo_note == "run" and (case.name, workers) not in gloo_runs and workers > 1:
                bar.set_description("%s %d ranks gloo" % (case.name, workers))
                anchor = run_gloo(workers, shapes_file, case, args)
                if anchor.status != "ok":
                    notes.append("%s %d ranks gloo: %s %s" % (case.name, workers, anchor.status,
                                                            anchor.detail))
                gloo_runs[(case.name, workers)] = anchor
    args.gloo_runs = gloo_runs
    args.loads.append(os.getloadavg()[0])
    print()
    print(table(rows, args.quick, args.measured_rate, gloo_runs))
    print("network: %s; gloo all-reduce anchor: %s" % (
        network, "torch.distributed gloo all_reduce, one rank per worker (host)"
        if args.gloo_note == "run" else args.gloo_note))
    flavors = sorted({r[5].flavor for r in rows if r[5].flavor})
    print("\ndist_byteps servers: launch.py --server %s (store talked to: %s servers); "
          "upstream: %s" % (byteps_server, ", ".join(flavors) or "?",
                            ", ".join(sorted({r[4].mode for r in rows if r[4].mode}))))
    print("load average (1 min) before %.2f, after %.2f" % tuple(args.loads))
    for note in notes:
        print("note:", note.replace("\n", "\n    "))
    write_json(rows, args.json_path, byteps_server, args)     # before the plot, which may fail
    plot(rows, args.plot_path, args.quick, network, args.network)
    print("plot: %s, results: %s" % (args.plot_path, args.json_path))
    failed = [r for r in rows if r[4].status != "ok" or r[5].status != "ok"]
    return 1 if failed else 0


def measure_links(rate_text: str) -> float:
    """TCP bytes/s of an emulated link of ``rate_text``, both directions, measured now."""
    sys.path.insert(0, ROOT)
    from kvstore_byteps.launcher import netns
    with netns.EmulatedNetwork(2, netns.parse_rate(rate_text)) as net:
        rates = [netns.measure_link_rate(net, a, b, 60 * 10 ** 6) for a, b in ((0, 1), (1, 0))]
    print("emulated %s link: %s MB/s of TCP payload" % (
        rate_text, " and ".join("%.1f" % (r / 1e6) for r in rates)), flush=True)
    return min(rates)


def gloo_note() -> str:
    """"run" when torch.distributed imports here (the anchor runs), else why it is skipped."""
    probe = subprocess.run([sys.executable, "-c", "import torch.distributed as d; "
                            "assert d.is_available() and d.is_gloo_available()"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if probe.returncode == 0:
        return "run"
    last = (probe.stdout.decode(errors="replace").strip().splitlines() or ["?"])[-1]
    if "No module named 'torch'" in last:
        return "skipped (torch is not installed)"
    return "skipped (torch does not import: %s)" % last[:200]


def run_gloo(workers: int, shapes_file: str, case: Case, args) -> Run:
    """torch.distributed gloo all_reduce of the same tensors by ``workers`` ranks, each on a
    host of its own on the emulated network (or on 127.0.0.1)."""
    warmup = case.warmup if args.warmup is None else args.warmup
    iters = case.iters if args.iters is None else args.iters
    run = Run("gloo all_reduce", "-")
    port = 29500
    net = None
    if args.network == "netns":
        from kvstore_byteps.launcher import netns
        net = netns.EmulatedNetwork(workers, netns.parse_rate(args.link_rate))
        net.create()
        master = "%s:%d" % (net.address(0), port)
    else:
        sys.path.insert(0, ROOT)
        from kvstore_byteps.ports import free_port
        master = "127.0.0.1:%d" % free_port()
    procs = []
    try:
        for rank in range(workers):
            prefix = net.exec_argv(rank) if net else []
            argv = prefix + [sys.executable, GLOO_WORKER, "--master", master, "--rank",
                             str(rank), "--world", str(workers), "--shapes", shapes_file,
                             "--iters", str(iters), "--warmup", str(warmup)]
            env = child_env()
            if net:      # gloo would pick the address of the machine's hostname otherwise
                env["GLOO_SOCKET_IFNAME"] = "eth0"
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=args.job_timeout)
            outputs.append((proc.returncode, out.decode(errors="replace")))
    except subprocess.TimeoutExpired:
        run.status = "timeout"
        return run
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if net is not None:
            net.destroy()
    results = [json.loads(line[len("GLOO_RESULT "):]) for _, out in outputs
               for line in out.splitlines() if line.startswith("GLOO_RESULT ")]
    if any(r["wrong_tensors"] for r in results):
        run.status = "wrong sums"
    elif len(results) != workers:
        run.status = "failed"
        run.detail = "\n".join(outputs[0][1].splitlines()[-8:])
    if results:
        run.median_s = statistics.median(max(t) for t in zip(*(r["times_s"] for r in results)))
    return run


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


if __name__ == "__main__":
    sys.exit(main())
