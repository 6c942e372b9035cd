"""One worker of the replay benchmark; started by ``bench_replay.py`` through ``launch.py``.

    python launch.py -n 2 -s 2 python benchmarks/_replay_worker.py \
        --kvstore dist_byteps --model resnet50_v1 --compute 1.7 --steps 20 --warmup 3

Replays an accelerator's training step as the host sees it: the step's ``--compute`` seconds
are spread over the model's layers in proportion to their FLOPs (backward twice the forward)
and spent asleep, as the host is while a GPU computes. Backward runs last layer first; as each
layer's gradients are "computed" (written: they hold ``rank + 1``) they are handed to the store
with ``kv.pushpull(i, grad, out=sum, priority=-i)``, as gluon's Trainer numbers and orders
them. The next step's forward waits, layer by layer, for that layer's sums. The inputs are
written again every step (upstream ``dist_sync`` sums into them), inside the layer's compute
time; after the last step every sum must be ``W * (W + 1) / 2`` (exit 3 otherwise).
``--optimizer momentum`` or ``adam`` hands the store that optimizer first (``set_optimizer``,
as gluon's ``update_on_kvstore=True`` does): the servers then update each key as its round is
summed and the outputs are the weights (not checked here: tests/cluster/test_sync_optimizer.py
checks them against dist_sync's).

Prints ``REPLAY_RESULT {json}``: each step's seconds, the seconds the forward waited for sums
in each step, the wall-clock window of the measured steps (``time.time()``; the benchmark reads
every role's CPU over it from outside), this process's CPU seconds per measured step by thread,
``[user, system]`` (``_cost_worker.threads``) and the timeline of the last step (``[kind, start,
end]`` from the step's start; kinds forward, wait, backward).
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

from _cost_worker import threads

RESULT_TAG = "REPLAY_RESULT "
EXIT_WRONG_SUM = 3
#: --optimizer: what set_optimizer hands the servers (tiny steps: the weights stay finite)
OPTIMIZERS = {"momentum": lambda: mx.optimizer.SGD(learning_rate=1e-6, momentum=0.9),
              "adam": lambda: mx.optimizer.Adam(learning_rate=1e-6)}
MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "replay_models.json")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", required=True,
                   help="dist_sync, dist_byteps, plain (the ceiling: _plain_ps.py) or gloo "
                   "(the all-reduce anchor: _gloo_replay.py)")
    p.add_argument("--model", default="resnet50_v1")
    p.add_argument("--models", default=MODELS, help="the models file (replay_models.py's)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--compute", type=float, required=True, help="compute seconds per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--optimizer", choices=["none"] + sorted(OPTIMIZERS), default="none",
                   help="the servers' optimizer (MXNet stores only)")
    return p.parse_args(argv)


def layer_times(layers, compute: float):
    """(forward, backward) seconds per layer: ``compute`` split by FLOPs, backward 2x."""
    total = sum(layer["flops"] for layer in layers)
    forward = [compute * layer["flops"] / total / 3 for layer in layers]
    return forward, [2 * t for t in forward]


def spend(seconds: float, since: float) -> None:
    """Sleep until ``seconds`` after ``since`` (the host is free while the device computes)."""
    left = since + seconds - time.perf_counter()
    if left > 0:
        time.sleep(left)


class MXNetStore:
    """The replay's arrays as MXNet NDArrays and an MXNet kvstore (ours or upstream)."""

    def __init__(self, kvstore: str, shapes, dtype: str, optimizer: str = "none"):
        self.kv = mx.kv.create(kvstore)
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        self.checked = optimizer == "none"       # sums, not weights: every one checked
        self.grads = {i: mx.nd.full(shapes[i], self.rank + 1, dtype=dtype) for i in sorted(shapes)}
        self.sums = {i: mx.nd.zeros(shapes[i], dtype=dtype) for i in sorted(shapes)}
        # The writes go through flat views (same memory, same engine variable): MXNet fills an
        # n-d array row by row of its last axis (3 or 1 elements for convolutions), which cost
        # ResNet-50 ~60 ms of host CPU a step where a device's write costs the host none; flat,
        # ~20 ms (the host still writes: upstream dist_sync sums into the inputs).
        self._flat = {i: self.grads[i].reshape((-1,)) for i in sorted(shapes)}
        for i in sorted(shapes):             # as gluon's Trainer initialises, in index order
            self.kv.init(i, self.sums[i])
        if optimizer != "none":
            self.kv.set_optimizer(OPTIMIZERS[optimizer]())
        mx.nd.waitall()
        self._set_value = mx.nd._internal._set_value

    def write(self, i: int) -> None:         # the device writes the gradient: one engine
        self._set_value(src=self.rank + 1, out=self._flat[i])   # call (x[:] = v made ~8)

    def pushpull(self, i: int) -> None:
        self.kv.pushpull(i, self.grads[i], out=self.sums[i], priority=-i)

    def wait(self, i: int) -> None:
        self.sums[i].wait_to_read()

    def result(self, i: int) -> np.ndarray:
        return self.sums[i].asnumpy()

    def close(self) -> None:
        mx.nd.waitall()


class PlainStore:
    """numpy arrays and the plain-socket ceiling (``_plain_ps.PlainKV``)."""

    def __init__(self, kvstore: str, shapes, dtype: str):
        from _plain_ps import PlainKV
        self.kv = PlainKV()
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        self.grads = {i: np.full(shapes[i], self.rank + 1, dtype=dtype) for i in sorted(shapes)}
        self.sums = {i: np.zeros(shapes[i], dtype=dtype) for i in sorted(shapes)}
        for i in sorted(shapes):
            self.kv.init(i, self.sums[i])

    def write(self, i: int) -> None:
        self.grads[i].fill(self.rank + 1)

    def pushpull(self, i: int) -> None:
        self.kv.pushpull(i, self.grads[i], self.sums[i], priority=-i)

    def wait(self, i: int) -> None:
        self.kv.wait(i)

    def result(self, i: int) -> np.ndarray:
        self.kv.wait(i)
        return self.sums[i]

    def close(self) -> None:
        self.kv.close()


class GlooStore(PlainStore):
    """torch tensors in DDP-style buckets and gloo's all-reduce (``_gloo_replay.GlooKV``)."""

    def __init__(self, kvstore: str, shapes, dtype: str):
        from _gloo_replay import GlooKV
        self.kv = GlooKV(shapes, dtype)
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        self.grads = self.sums = {i: self.kv.grad(i) for i in shapes}   # sums land in place

    def write(self, i: int) -> None:
        self.grads[i].fill_(self.rank + 1)

    def pushpull(self, i: int) -> None:
        self.kv.pushpull(i)

    def result(self, i: int) -> np.ndarray:
        self.kv.wait(i)
        return self.sums[i].numpy()


STORES = {"plain": PlainStore, "gloo": GlooStore}


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.models) as f:
        layers = json.load(f)[args.model]
    shapes = {i: tuple(shape) for layer in layers
              for i, shape in zip(layer["index"], layer["params"])}
    store = (STORES[args.kvstore](args.kvstore, shapes, args.dtype) if args.kvstore in STORES
             else MXNetStore(args.kvstore, shapes, args.dtype, args.optimizer))
    rank, workers = store.rank, store.num_workers
    forward, backward = layer_times(layers, args.compute)
    steps, waits = [], []
    window_start = None
    started = time.perf_counter()
    timeline = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            window_start = time.time()
            threads_before = threads()
        waited, timeline = 0.0, []
        for layer, seconds in zip(layers, forward):
            before = time.perf_counter()
            for i in layer["index"]:
                store.wait(i)                # the previous step's sum of this layer
            after = time.perf_counter()
            waited += after - before
            spend(seconds, after)
            timeline += [["wait", before - started, after - started],
                         ["forward", after - started, time.perf_counter() - started]]
        for layer, seconds in zip(reversed(layers), reversed(backward)):
            begin = time.perf_counter()
            for i in layer["index"]:
                store.write(i)
            spend(seconds, begin)
            for i in layer["index"]:
                store.pushpull(i)
            timeline.append(["backward", begin - started, time.perf_counter() - started])
        now = time.perf_counter()
        if step >= args.warmup:
            steps.append(now - started)
            waits.append(waited)
        started = now
    window = [window_start, time.time()]
    threads_after = threads()
    per_thread = {name: [round((threads_after[name][i] - was[i]) / args.steps, 4)
                         for i in (0, 1)]
                  for name, was in threads_before.items() if name in threads_after}
    want = workers * (workers + 1) / 2
    wrong = [i for i in sorted(shapes) if getattr(store, "checked", True)
             and not np.all(store.result(i) == want)]
    store.close()
    timeline = [[kind, round(a, 4), round(b, 4)] for kind, a, b in timeline if b - a > 1e-4]
    print(RESULT_TAG + json.dumps({"rank": rank, "steps": steps, "waits": waits,
                                   "window": window, "timeline": timeline,
                                   "wrong_sums": len(wrong),
                                   "threads_s": {k: v for k, v in per_thread.items() if sum(v) > 0}}),
          flush=True)
    return EXIT_WRONG_SUM if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
