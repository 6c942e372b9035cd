"""Trains a small gluon model for a few steps on this worker's shard; saves the parameters.

    gluon_train.py OUT_DIR [--contexts N] [--steps S] [--kvstore dist_byteps]

Worker w takes rows [w*b, (w+1)*b) of each step's global batch (see ``batches``), so the
distributed run must match one process training on the whole global batch with
``trainer.step(b)`` (the sum over workers, scaled by the per-worker batch size).
"""
import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

FEATURES, BATCH = 8, 6


def build_net(contexts):
    mx.random.seed(42)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=contexts)
    return net


def batches(steps, num_workers):
    """The global batch of every step (same on every worker and in the reference)."""
    rng = np.random.RandomState(7)
    for _ in range(steps):
        x = rng.randn(BATCH * num_workers, FEATURES).astype(np.float32)
        y = rng.randn(BATCH * num_workers, 4).astype(np.float32)
        yield x, y


def train_step(net, trainer, loss_fn, x, y, contexts):
    xs = np.array_split(x, len(contexts))
    ys = np.array_split(y, len(contexts))
    with autograd.record():
        losses = [loss_fn(net(mx.nd.array(a, ctx=c)), mx.nd.array(b, ctx=c))
                  for a, b, c in zip(xs, ys, contexts)]
    autograd.backward(losses)
    trainer.step(BATCH)


def params_of(net):
    """Parameters by creation order (gluon's names depend on how many nets a process built)."""
    return {"p%02d" % i: p.data(p.list_ctx()[0]).asnumpy()
            for i, p in enumerate(net.collect_params().values())}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--contexts", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kvstore", default="dist_byteps")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args()
    contexts = [getattr(mx, args.device)(i) for i in range(args.contexts)]
    kv = mx.kv.create(args.kvstore)
    net = build_net(contexts)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.L2Loss()
    rank, nw = kv.rank, kv.num_workers
    for x, y in batches(args.steps, nw):
        rows = slice(rank * BATCH, (rank + 1) * BATCH)
        train_step(net, trainer, loss_fn, x[rows], y[rows], contexts)
    np.savez(os.path.join(args.out_dir, "rank%d.npz" % rank), **params_of(net))
    print("rank %d trained %d steps, update_on_kvstore=%s" % (rank, args.steps,
                                                              trainer._update_on_kvstore))


if __name__ == "__main__":
    main()
