"""One worker of the straggler benchmark; started by ``bench_straggler.py`` through ``launch.py``.

    python launch.py -n 4 -s 2 python benchmarks/_straggler_worker.py --kvstore dist_byteps \
        --epochs 6 --step-time 0.03 --slow-rank 3 --slow-factor 2

Trains the demo's model on the demo's data (``examples/train_digits.py``: same net, shards,
learning rate, and the global-batch scaling in both modes) through ``--kvstore`` (``dist_byteps``,
or MXNet's ``dist_sync`` / ``dist_async`` for comparison), with each
step stretched to ``--step-time`` seconds (``--slow-factor`` times that on ``--slow-rank``) by
sleeping, as the host is while an accelerator computes. Synchronous training, with backup
workers (``BYTEPS_BACKUP_WORKERS``), or asynchronous (``BYTEPS_ENABLE_ASYNC=1`` with
dist_byteps, or dist_async): with the last two the store updates. The natural script: every
worker runs the same ``--epochs`` on its shard, the slow one too. With backup workers the job's
training is over once all workers but the backups finished: a worker still training stops at
its next step (``kvstore_byteps.TrainingOver``, caught here). Then every worker calls
``kvstore_byteps.finish_training`` (the servers' final weights; nothing in sync mode), or with
``--ending barrier`` ``kv._barrier()`` and, where the store holds the weights, a ``kv.pull`` of
each parameter (as MXNet scripts with ``update_on_kvstore`` read the final weights).

Rank 0 measures the test accuracy after every epoch and of the final weights. Prints
``STRAGGLER_RESULT {json}``: rank, samples trained, whether TrainingOver ended its training,
the wall-clock window from the store's creation to the end of finish_training
(``time.time()``), on rank 0 ``[seconds since start, test accuracy]`` per epoch and the final
accuracy.
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import train_digits as demo  # noqa: E402  (the demo's data, model and accuracy)

import kvstore_byteps  # noqa: E402

RESULT_TAG = "STRAGGLER_RESULT "


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", default="dist_byteps")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--step-time", type=float, default=0.03, help="seconds per step")
    p.add_argument("--slow-rank", type=int, default=-1, help="the straggler's rank (-1: none)")
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0,
                   help="the run's seed: the initial weights' and every shard's order (0: the "
                   "demo's)")
    p.add_argument("--ending", choices=["finish", "barrier"], default="finish",
                   help="after the loop: kvstore_byteps.finish_training, or a barrier and a "
                   "pull of the weights")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    kv = mx.kv.create(args.kvstore)
    on_store = demo.updates_on_store(kv)      # async, or backup workers: the store updates
    slow = kv.rank == args.slow_rank
    step_time = args.step_time * (args.slow_factor if slow else 1.0)
    x_train, y_train, x_test, y_test = demo.load_data()
    x_mine, y_mine = demo.shard(x_train, y_train, kv.rank, kv.num_workers)
    net = demo.build_net([mx.cpu()], 42 + args.seed)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": args.momentum}, kvstore=kv,
                            update_on_kvstore=None if on_store else False)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(kv.rank + 1000 * args.seed)
    steps = len(x_mine) // args.batch_size
    global_batch = args.batch_size * kv.num_workers
    samples, log, ended = 0, [], False
    started = time.time()
    try:
        for _ in range(args.epochs):
            order = rng.permutation(len(x_mine))
            for step in range(steps):
                begin = time.perf_counter()
                rows = order[step * args.batch_size:(step + 1) * args.batch_size]
                with autograd.record():
                    loss = loss_fn(net(nd.array(x_mine[rows])), nd.array(y_mine[rows]))
                loss.backward()
                trainer.step(global_batch)
                left = begin + step_time - time.perf_counter()
                if left > 0:
                    time.sleep(left)
                samples += len(rows)
            if kv.rank == 0:
                log.append([round(time.time() - started, 3),
                            demo.accuracy(net, x_test, y_test, mx.cpu())])
    except kvstore_byteps.TrainingOver:      # backup workers: the job's training is over
        ended = True
    if args.ending == "finish":
        kvstore_byteps.finish_training(trainer)
    else:
        mx.nd.waitall()
        kv._barrier()
        if on_store:           # the servers hold the weights: read the final ones
            for index, param in enumerate(trainer._params):
                kv.pull(index, out=param.list_data(), priority=-index)
    mx.nd.waitall()
    finished = time.time()
    final = demo.accuracy(net, x_test, y_test, mx.cpu()) if kv.rank == 0 else None
    print(RESULT_TAG + json.dumps({"rank": kv.rank, "samples": samples, "ended": ended,
                                   "window": [started, finished], "accuracy": log,
                                   "final_accuracy": final}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
