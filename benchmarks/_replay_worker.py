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

Prints ``REPLAY_RESULT {json}``: each step's seconds, the seconds the forward waited for sums
in each step, the wall-clock window of the measured steps (``time.time()``; the benchmark reads
every role's CPU over it from outside) and the timeline of the last step (``[kind, start,
end]`` from the step's start; kinds forward, wait, backward).
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

RESULT_TAG = "REPLAY_RESULT "
EXIT_WRONG_SUM = 3
MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "replay_models.json")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", required=True, help="dist_sync or dist_byteps")
    p.add_argument("--model", default="resnet50_v1")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--compute", type=float, required=True, help="compute seconds per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
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


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(MODELS) as f:
        layers = json.load(f)[args.model]
    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    shapes = {i: tuple(shape) for layer in layers
              for i, shape in zip(layer["index"], layer["params"])}
    grads = {i: mx.nd.full(shapes[i], rank + 1, dtype=args.dtype) for i in sorted(shapes)}
    sums = {i: mx.nd.zeros(shapes[i], dtype=args.dtype) for i in sorted(shapes)}
    for i in sorted(shapes):                 # as gluon's Trainer initialises, in index order
        kv.init(i, sums[i])
    mx.nd.waitall()
    forward, backward = layer_times(layers, args.compute)
    set_value = mx.nd._internal._set_value
    steps, waits = [], []
    window_start = None
    started = time.perf_counter()
    timeline = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            window_start = time.time()
        waited, timeline = 0.0, []
        for layer, seconds in zip(layers, forward):
            before = time.perf_counter()
            for i in layer["index"]:
                sums[i].wait_to_read()       # the previous step's sum of this layer
            after = time.perf_counter()
            waited += after - before
            spend(seconds, after)
            timeline += [["wait", before - started, after - started],
                         ["forward", after - started, time.perf_counter() - started]]
        for layer, seconds in zip(reversed(layers), reversed(backward)):
            begin = time.perf_counter()
            for i in layer["index"]:         # the device writes the gradient: one engine
                set_value(src=rank + 1, out=grads[i])   # call (x[:] = v made ~8 C calls)
            spend(seconds, begin)
            for i in layer["index"]:
                kv.pushpull(i, grads[i], out=sums[i], priority=-i)
            timeline.append(["backward", begin - started, time.perf_counter() - started])
        now = time.perf_counter()
        if step >= args.warmup:
            steps.append(now - started)
            waits.append(waited)
        started = now
    window = [window_start, time.time()]
    mx.nd.waitall()
    want = workers * (workers + 1) / 2
    wrong = [i for i in sorted(shapes) if not np.all(sums[i].asnumpy() == want)]
    timeline = [[kind, round(a, 4), round(b, 4)] for kind, a, b in timeline if b - a > 1e-4]
    print(RESULT_TAG + json.dumps({"rank": rank, "steps": steps, "waits": waits,
                                   "window": window, "timeline": timeline,
                                   "wrong_sums": len(wrong)}), flush=True)
    return EXIT_WRONG_SUM if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
