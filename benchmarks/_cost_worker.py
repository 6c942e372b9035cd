"""One worker of the cost-model benchmark; started by ``bench_cost.py`` through ``launch.py``.

    python launch.py -n 2 -s 2 python benchmarks/_cost_worker.py --kvstore dist_byteps \
        --grid '[[10, 4096], [1000, 4096]]'

For each cell of the grid (``[keys, bytes per key]``, float32 tensors) every worker initialises
that many keys (their own key range), pushpulls every key (priority = -index) then waits for
all, twice untimed, then ``iters`` rounds between two barriers. Per cell it prints one line
``COST_RESULT {json}``: wall-clock start and end of the measured rounds (for the servers' CPU,
sampled by the parent from ``/proc``), this process's user and system CPU per round, per thread
(by name), voluntary and involuntary context switches and time in Python's cyclic garbage
collector per round, and, on
rank 0, the machine's TCP segments and loopback bytes sent per round (the whole job's, both
directions: what the kernel carried for it). No sums are checked here: bench_pushpull does that.
"""
import argparse
import gc
import json
import os
import sys
import threading
import time
from typing import Dict, Tuple

import mxnet as mx
import numpy as np

RESULT_TAG = "COST_RESULT "
_TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", required=True, help="dist_sync or dist_byteps")
    p.add_argument("--grid", required=True, help="JSON: [[keys, bytes per key], ...]")
    p.add_argument("--seconds", type=float, default=2.5,
                   help="about how long each cell's measured rounds last")
    return p.parse_args(argv)


def rounds_for(keys: int, nbytes: int, seconds: float) -> int:
    """Rounds that take about ``seconds`` (a rough guess, the same on every worker)."""
    guess = 2e-3 + keys * 4e-5 + keys * nbytes * 1e-8
    return int(min(1000, max(5, seconds / guess)))


def threads() -> Dict[str, Tuple[float, float]]:
    """Per thread: (user, system) CPU seconds so far. Python threads by their name (digits
    dropped, so a pool's threads add up), the others (MXNet's engine, its ps-lite, numpy's
    BLAS) as ``native``."""
    names = {t.native_id: t.name.rstrip("0123456789-_ ") or t.name
             for t in threading.enumerate()}
    out: Dict[str, Tuple[float, float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                text = f.read()
        except OSError:
            continue
        name = names.get(int(tid), "native")
        fields = text.rsplit(")", 1)[1].split()
        user, system = int(fields[11]) / _TICKS, int(fields[12]) / _TICKS
        was = out.get(name, (0.0, 0.0))
        out[name] = (was[0] + user, was[1] + system)
    return out


def switches() -> Tuple[int, int]:
    """(voluntary, involuntary) context switches of all this process's threads so far."""
    voluntary = involuntary = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/status" % tid) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary += int(line.split()[1])
        except OSError:
            continue
    return voluntary, involuntary


def network() -> Tuple[int, int]:
    """(TCP segments sent, loopback bytes sent) by the whole machine so far."""
    segments = 0
    with open("/proc/net/snmp") as f:
        lines = [line.split() for line in f if line.startswith("Tcp:")]
    segments = int(lines[1][lines[0].index("OutSegs")])
    sent = 0
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                sent = int(counters.split()[8])
    return segments, sent


class Collections:
    """Time in Python's cyclic garbage collector and collections per generation, so far (a
    callback on every collection, whichever thread runs it)."""

    def __init__(self):
        self.seconds, self.count, self._started = 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.count[info["generation"]] += 1

    def now(self) -> Tuple[float, list]:
        return self.seconds, list(self.count)


def one_round(kv, first_key: int, grads, outs) -> None:
    for i, (grad, out) in enumerate(zip(grads, outs)):
        kv.pushpull(first_key + i, grad, out=out, priority=-i)
    mx.nd.waitall()


def main(argv=None) -> int:
    args = parse_args(argv)
    grid = [tuple(cell) for cell in json.loads(args.grid)]
    kv = mx.kv.create(args.kvstore)
    collections = Collections()
    first_key = 0
    for keys, nbytes in grid:
        size = nbytes // 4
        grads = [mx.nd.ones((size,), dtype=np.float32) for _ in range(keys)]
        outs = [mx.nd.zeros((size,), dtype=np.float32) for _ in range(keys)]
        for i, out in enumerate(outs):
            kv.init(first_key + i, out)
        mx.nd.waitall()
        for _ in range(2):
            one_round(kv, first_key, grads, outs)
        rounds = rounds_for(keys, nbytes, args.seconds)
        kv._barrier()
        threads0, switches0, net0, gc0 = threads(), switches(), network(), collections.now()
        cpu0, start = os.times(), time.time()
        for _ in range(rounds):
            one_round(kv, first_key, grads, outs)
        cpu1, end = os.times(), time.time()
        threads1, switches1, net1, gc1 = threads(), switches(), network(), collections.now()
        per_thread = {name: round((threads1[name][0] + threads1[name][1] - was[0] - was[1])
                                  / rounds, 6)
                      for name, was in threads0.items() if name in threads1}
        result = {"rank": kv.rank, "kvstore": args.kvstore, "keys": keys, "bytes": nbytes,
                  "rounds": rounds, "start": start, "end": end,
                  "wall_s": (end - start) / rounds,
                  "user_s": (cpu1.user - cpu0.user) / rounds,
                  "system_s": (cpu1.system - cpu0.system) / rounds,
                  "threads_s": {k: v for k, v in per_thread.items() if v > 0},
                  "voluntary_switches": (switches1[0] - switches0[0]) / rounds,
                  "involuntary_switches": (switches1[1] - switches0[1]) / rounds,
                  "gc_s": (gc1[0] - gc0[0]) / rounds,
                  "gc_collections": [(b - a) / rounds for a, b in zip(gc0[1], gc1[1])]}
        if kv.rank == 0:
            result["tcp_segments"] = (net1[0] - net0[0]) / rounds
            result["lo_bytes"] = (net1[1] - net0[1]) / rounds
        print(RESULT_TAG + json.dumps(result), flush=True)
        kv._barrier()
        first_key += keys
        del grads, outs
    return 0


if __name__ == "__main__":
    sys.exit(main())
