"""One worker of the training benchmark; started by ``bench_training.py`` through ``launch.py``.

    python launch.py -n 4 -s 4 python benchmarks/_train_worker.py --kvstore dist_byteps --steps 20

Trains gluon's ``resnet18_v1`` (10 classes) on synthetic 32x32 images with ``gluon.Trainer``
(``--optimizer``; the update on the workers, or with ``--update-on servers`` on the store's
servers, ``update_on_kvstore=True``) for ``--warmup`` + ``--steps`` steps and prints one line
``TRAIN_RESULT {json}`` with the timed steps' wall time. ``--kvstore none`` trains in one
process without a store (the single-process anchor). ``--no-priority`` sends every gradient
with priority 0, turning BytePS's priority scheduling off (gluon passes ``-parameter index``).
"""
import argparse
import json
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

RESULT_TAG = "TRAIN_RESULT "
#: --optimizer: gluon's optimizer name and parameters
OPTIMIZERS = {"sgd": ("sgd", {"learning_rate": 0.01}),
              "momentum": ("sgd", {"learning_rate": 0.01, "momentum": 0.9}),
              "adam": ("adam", {"learning_rate": 0.001})}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", required=True, help="dist_byteps, dist_sync or none")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4, help="images per worker per step")
    p.add_argument("--no-priority", action="store_true")
    p.add_argument("--update-on", choices=["workers", "servers"], default="workers",
                   help="where the optimizer runs (gluon's update_on_kvstore False / True)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    return p.parse_args(argv)


def flat_priorities(kv) -> None:
    """Make every pushpull of ``kv`` use priority 0 (the instance attribute hides the method)."""
    original = kv.pushpull

    def pushpull(key, value, out=None, priority=0):
        return original(key, value, out=out, priority=0)
    kv.pushpull = pushpull


def main(argv=None) -> int:
    args = parse_args(argv)
    mx.random.seed(1)
    kv = None if args.kvstore == "none" else mx.kv.create(args.kvstore)
    if kv is not None and args.no_priority:
        flat_priorities(kv)
    net = gluon.model_zoo.vision.resnet18_v1(classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    name, params = OPTIMIZERS[args.optimizer]
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=kv,
                            update_on_kvstore=None if kv is None else args.update_on == "servers")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0 if kv is None else kv.rank)
    data = mx.nd.array(rng.rand(args.batch_size, 3, 32, 32).astype(np.float32))
    label = mx.nd.array(rng.randint(0, 10, args.batch_size).astype(np.float32))
    started = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            mx.nd.waitall()
            started = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(args.batch_size)
    mx.nd.waitall()
    elapsed = time.perf_counter() - started
    grad_bytes = sum(p.data().size * 4 for p in net.collect_params().values()
                     if p.grad_req != "null")
    print(RESULT_TAG + json.dumps({
        "rank": 0 if kv is None else kv.rank, "kvstore": args.kvstore,
        "priority": not args.no_priority, "update_on": args.update_on,
        "optimizer": args.optimizer, "steps": args.steps, "seconds": elapsed,
        "grad_bytes": grad_bytes, "loss": float(loss.mean().asscalar())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
