"""Gradient buckets under stress: a model-free training step, random in everything buckets
decide on. ``bucket_stress.py SEED STEPS``.

The model is SEED's (the same on every worker): 6 to 40 tensors, most of them tiny (1-64
elements) or small (up to 4096), a few huge (up to 600,000), float32 with a run of float16;
layers of one or two tensors; declared in one ``kv.init(keys, arrays)`` or one by one.

A step is a replayed training step: the forward waits for each layer's sum in order 0..n-1
(and checks it exactly), the backward writes each layer's gradients and pushes them last layer
first with ``priority=-i``. Before each layer a delay drawn per worker (SEED and the rank: hosts
pace differently): mostly a few milliseconds, and once a step on half the workers up to 1.5 s
(a slow layer, a loaded host) between two members of a bucket or anywhere else.

Every round must complete: a round that does not fails its request or its bucket's deadline
(the test sets short ones) and the worker exits non-zero; a step over STEP_LIMIT_S ends the
worker with "ROUND NOT COMPLETE" naming the key it waits for. Prints "STRESS OK <summary>".
"""
import os
import sys
import threading
import time

import mxnet as mx
import numpy as np

STEP_LIMIT_S = 40.0


def model(seed):
    """``[(shape, dtype), ...]`` and the layers (lists of tensor indices) of SEED's model."""
    rng = np.random.RandomState(seed)
    count = int(rng.randint(6, 41))
    half = rng.rand() < 0.5
    tensors = []
    for i in range(count):
        kind = rng.choice(["tiny", "small", "huge"], p=[0.5, 0.38, 0.12])
        size = {"tiny": lambda: rng.randint(1, 65), "small": lambda: rng.randint(65, 4097),
                "huge": lambda: rng.randint(100000, 600001)}[kind]()
        dtype = "float16" if half and count // 3 <= i < count // 2 else "float32"
        tensors.append(((int(size),), dtype))
    layers, i = [], 0
    while i < count:
        width = min(int(rng.randint(1, 3)), count - i)
        layers.append(list(range(i, i + width)))
        i += width
    return tensors, layers, bool(rng.rand() < 0.5)


def delays(seed, rank, layers, steps):
    """Per step, per layer: seconds before it (forward and backward), this worker's own."""
    rng = np.random.RandomState(seed * 1000 + rank + 1)
    plan = rng.uniform(0.0, 0.01, size=(steps, len(layers)))
    for step in range(steps):
        if rng.rand() < 0.5:
            plan[step, rng.randint(len(layers))] = rng.uniform(0.3, 1.5)
    return plan


class Watchdog:
    """Ends the worker, naming what it waits for, when a step takes over STEP_LIMIT_S."""

    def __init__(self):
        self.step, self.waiting, self.began = 0, None, time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(1.0)
            if time.monotonic() - self.began > STEP_LIMIT_S:
                print("ROUND NOT COMPLETE step %d: waiting for key %s after %.0f s"
                      % (self.step, self.waiting, STEP_LIMIT_S), flush=True)
                os._exit(4)


def main(seed, steps):
    tensors, layers, in_one_init = model(seed)
    kv = mx.kv.create("dist_byteps")
    rank, workers = kv.rank, kv.num_workers
    grads = [mx.nd.zeros(shape, dtype=dtype) for shape, dtype in tensors]
    outs = [mx.nd.zeros(shape, dtype=dtype) for shape, dtype in tensors]
    keys = list(range(len(tensors)))
    if in_one_init:
        kv.init(keys, outs)
    else:
        for key in keys:
            kv.init(key, outs[key])
    pace = delays(seed, rank, layers, steps + 1)
    dog = Watchdog()
    for step in range(steps + 1):
        dog.step, dog.began = step, time.monotonic()
        for layer, delay in zip(layers, pace[step]):
            for i in layer:
                dog.waiting = i
                got = outs[i].asnumpy()             # the previous step's sum of this layer
                want = 0 if step == 0 else sum(w + step for w in range(1, workers + 1))
                if not np.all(got == want):
                    print("WRONG SUM step %d key %d: %s, want %s" % (step, i, got[:3], want))
                    return 3
            time.sleep(delay)
        if step == steps:
            break
        for layer, delay in zip(reversed(layers), reversed(pace[step])):
            time.sleep(delay)
            for i in layer:
                grads[i][:] = rank + 1 + step + 1
            for i in reversed(layer):
                kv.pushpull(i, grads[i], out=outs[i], priority=-i)
    formed = kv._engine.fusion.plan.fused()
    print("STRESS OK seed %d: %d tensors in %d layers (%s), %d buckets (%d went alone), %d steps"
          % (seed, len(tensors), len(layers), "one init" if in_one_init else "init one by one",
             len(formed), sum(b.dissolved for b in formed), steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
