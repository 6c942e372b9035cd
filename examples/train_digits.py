"""Data-parallel training of a small MLP on scikit-learn's digits with ``kvstore='dist_byteps'``.

    python launch.py -n 2 -s 2 python examples/train_digits.py [--epochs 8] [--contexts 2]

The digits set (1797 8x8 images, 10 classes) ships inside scikit-learn, so nothing is downloaded.
Every worker shuffles the same way, keeps the same held-out test split and trains on its own
shard of the rest (by rank). ``gluon.Trainer`` sums the gradients over the workers (and over the
``--contexts`` CPU contexts of a worker) through the ``dist_byteps`` store and picks where the
SGD step runs by MXNet's own rules, as for ``dist_sync``: on the store's servers
(``update_on_kvstore=True``, the default for a distributed store that takes the optimizer), or,
with ``MXNET_UPDATE_ON_KVSTORE=0``, on every worker (the servers only sum). Rank 0 prints one
line per epoch: the mean training loss (rank 0's own where the servers update, since every push
is then a gradient for the optimizer; else over all workers, summed through the store) and the
accuracy on the held-out test set. At the end the workers check, through the store, that they
all hold identical parameters.

With ``BYTEPS_ENABLE_ASYNC=1`` (on every node) it trains asynchronously: the store takes the
optimizer (gluon's ``update_on_kvstore=True``), each worker's update is scaled by the global
batch as in synchronous training (so the same learning rate fits), the loss printed is rank 0's
own, and ``kvstore_byteps.finish_training(trainer)`` leaves every worker with the servers' final
weights before they are compared. With ``BYTEPS_BACKUP_WORKERS=1`` it trains synchronously,
each round without its slowest worker: the store takes the optimizer too (the servers run it),
so the same holds; and once all workers but one finished, the job's training is over: a worker
still training stops at its next step (``kvstore_byteps.TrainingOver``, caught here so that it
too reads the final weights and joins the comparison).

Lines start with ``[digits]``; ``launch.py`` adds ``[worker 0]`` in front.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon, nd

import kvstore_byteps

PREFIX = "[digits]"
SPLIT_SEED = 1234          # the same shuffle (and so the same test split) on every worker
TEST_FRACTION = 0.2
# Keys 0..len(params)-1 belong to the Trainer (one per parameter); ours come after them.
EXTRA_KEYS = 1000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="samples per worker per step (the global batch is this x workers)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--contexts", type=int, default=1,
                        help="CPU contexts per worker; each batch is split over them")
    parser.add_argument("--seed", type=int, default=42, help="parameter initialisation seed")
    parser.add_argument("--kvstore", default="dist_byteps",
                        help="the store's type (dist_sync: MXNet's own, for comparison)")
    parser.add_argument("--compression", metavar="JSON",
                        help="gradient compression, gluon.Trainer's compression_params as JSON, "
                             "e.g. '{\"compressor\": \"onebit\", \"ef\": \"vanilla\", "
                             "\"scaling\": true}'")
    parser.add_argument("--commit-every", type=int, default=100, metavar="STEPS",
                        help="elastic jobs (launch.py --min-workers): a worker that takes a "
                             "departed one's place joins at the others' next commit, made at "
                             "the end of every epoch and every STEPS steps (a commit costs a "
                             "message to a server; default %(default)s)")
    parser.add_argument("--save-params", metavar="FILE",
                        help="rank 0 saves the trained parameters here (gluon's format), e.g. to "
                             "compare runs on different clusters")
    args = parser.parse_args(argv)
    if min(args.epochs, args.batch_size, args.contexts, args.commit_every) < 1:
        parser.error("--epochs, --batch-size, --contexts and --commit-every must be positive")
    return args


def count(number: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return "%d %s%s" % (number, noun, "" if number == 1 else "s")


def say(kv, text: str) -> None:
    """Print from rank 0 only, so the launcher's output has one copy of each line."""
    if kv.rank == 0:
        print("%s %s" % (PREFIX, text), flush=True)


def load_data():
    """(x_train, y_train, x_test, y_test): digits scaled to [0, 1], one fixed shuffle."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def shard(x, y, rank: int, num_workers: int):
    """This worker's equal share of the training set (equal sizes keep the workers in step)."""
    per_worker = len(x) // num_workers
    rows = np.arange(rank, per_worker * num_workers, num_workers)
    return x[rows], y[rows]


def build_net(contexts, seed: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(128, activation="relu"),
            gluon.nn.Dense(64, activation="relu"),
            gluon.nn.Dense(10))
    mx.random.seed(seed)      # same start on every worker (the store broadcasts rank 0's anyway)
    net.initialize(mx.init.Xavier(), ctx=contexts)
    net.hybridize()
    return net


def global_sum(kv, key: int, values) -> np.ndarray:
    """Sum a float64 vector over all workers through the store (``key`` initialised with the
    same shape: like MXNet's dist stores, a key is initialised once before its first pushpull)."""
    array = nd.array(np.asarray(values, np.float64), dtype=np.float64)
    kv.pushpull(key, array)
    return array.asnumpy()


def accuracy(net, x, y, ctx) -> float:
    predictions = net(nd.array(x, ctx=ctx)).argmax(axis=1).asnumpy()
    return float((predictions == y).mean())


def train_epoch(net, trainer, loss_fn, x, y, args, contexts, rng, steps, workers,
                state) -> tuple:
    """One epoch of ``steps`` steps (the same on every worker) over this worker's shard, from
    step ``state.batch`` on (where a worker that took a departed one's place in an elastic job
    resumes); returns (sum of losses, samples seen). A global batch is ``workers`` workers'
    (each round is scaled to that many). ``state.commit()`` every ``--commit-every`` steps:
    where a worker joins."""
    order = rng.permutation(len(x))
    global_batch = args.batch_size * workers
    total = nd.zeros(1, ctx=contexts[0])   # summed on the engine, read once: no sync per step
    first = state.batch
    for step in range(first, steps):
        # (a worker that joined a grown job has a smaller shard: it goes round it again)
        rows = order[np.arange(step * args.batch_size, (step + 1) * args.batch_size) % len(x)]
        data = gluon.utils.split_and_load(nd.array(x[rows]), contexts, even_split=False)
        label = gluon.utils.split_and_load(nd.array(y[rows]), contexts, even_split=False)
        with autograd.record():
            losses = [loss_fn(net(d), l) for d, l in zip(data, label)]
        autograd.backward(losses)
        trainer.step(global_batch)   # gradients are summed over workers and contexts
        for loss in losses:
            total += loss.sum().as_in_context(contexts[0])
        state.batch = step + 1
        if state.batch % args.commit_every == 0:
            state.commit()
    return float(total.asscalar()), (steps - first) * args.batch_size


def updates_on_store(kv) -> bool:
    """Whether gluon's Trainer will update on the store, by MXNet's rules (gluon's default
    ``update_on_kvstore``): a store that takes the optimizer, unless
    ``MXNET_UPDATE_ON_KVSTORE=0``; asynchronous training always does (gluon requires it). Then
    every push is a gradient for the optimizer."""
    return "async" in kv.type or (kv.is_capable("optimizer") and
                                  os.environ.get("MXNET_UPDATE_ON_KVSTORE", "1") != "0")


def check_identical(kv, net, key: int, metrics_key) -> float:
    """Every worker compares its parameters with rank 0's (broadcast through the store under
    ``key``); the mismatch counts are summed over workers under ``metrics_key`` (None: in
    asynchronous training, where a push is an update, each worker checks its own). Returns the
    sum of the absolute parameter values; raises on a mismatch."""
    named = [(name, p.data(p.list_ctx()[0]).asnumpy().ravel())
             for name, p in net.collect_params().items()]
    mine = np.concatenate([values for _, values in named]).astype(np.float32)
    theirs = nd.zeros(mine.shape, dtype=np.float32)
    kv.broadcast(key, nd.array(mine), out=theirs)
    unequal = mine != theirs.asnumpy()
    total = differing = int(np.count_nonzero(unequal))
    if metrics_key is not None:
        total = int(global_sum(kv, metrics_key, [differing, 0])[0])
    if total:
        # which parameters differ from rank 0's here (none on rank 0 itself): where to look
        pieces = np.split(unequal, np.cumsum([values.size for _, values in named])[:-1])
        which = ["%s (%d of %d)" % (name, np.count_nonzero(piece), piece.size)
                 for (name, _), piece in zip(named, pieces) if piece.any()]
        raise RuntimeError("workers disagree on %d parameter values%s" % (
            total, "; here, against rank 0's: " + ", ".join(which) if which else ""))
    return float(np.abs(mine).sum())


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    kv = mx.kv.create(args.kvstore)
    contexts = [mx.cpu(i) for i in range(args.contexts)]
    x_train, y_train, x_test, y_test = load_data()
    x_mine, y_mine = shard(x_train, y_train, kv.rank, kv.num_workers)
    # an elastic job's rounds stand for its DMLC_NUM_WORKER workers, whoever is in it: the
    # global batch and the steps of an epoch follow that, the same on every worker
    workers = kvstore_byteps.elastic.scale_workers(kv)
    steps = len(x_train) // workers // args.batch_size
    say(kv, "%s x %s, kvstore %s; %d training samples (%d per worker), %d test"
        % (count(kv.num_workers, "worker"), count(len(contexts), "context"), kv.type,
           len(x_train), len(x_mine), len(x_test)))

    net = build_net(contexts, args.seed)
    on_store = updates_on_store(kv)
    say(kv, "updates on the %s (update_on_kvstore=%s, %s)" % (
        ("servers", True, "MXNet's default for a distributed store; MXNET_UPDATE_ON_KVSTORE=0 "
         "updates on the workers") if on_store else
        ("workers", False, "MXNET_UPDATE_ON_KVSTORE=0: the servers only sum")))
    # gluon picks update_on_kvstore by MXNet's rules, as the line above says
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": args.momentum}, kvstore=kv,
                            update_on_kvstore=on_store,
                            compression_params=json.loads(args.compression)
                            if args.compression else None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(args.seed + kv.rank)    # each worker shuffles its shard its own way
    metrics_key = EXTRA_KEYS                             # [loss sum, samples] per epoch
    kv.init(metrics_key, nd.zeros(2, dtype=np.float64))
    # where to resume: a worker that takes a departed one's place in an elastic job
    # (launch.py --min-workers N --max-restarts K) starts at the others' next commit
    state = kvstore_byteps.elastic.State(kv, trainer, epoch=1, batch=0)
    try:
        while state.epoch <= args.epochs:
            epoch, tic = state.epoch, time.perf_counter()
            loss_sum, seen = train_epoch(net, trainer, loss_fn, x_mine, y_mine, args, contexts,
                                         rng, steps, workers, state)
            if on_store:     # a push is an update of the weights: no sums through the store
                loss_total, seen_total = loss_sum, seen
            else:
                loss_total, seen_total = global_sum(kv, metrics_key, [loss_sum, seen])
            say(kv, "epoch %d/%d  train loss %.4f  test accuracy %.4f  (%.2f s)"
                % (epoch, args.epochs, loss_total / max(seen_total, 1),
                   accuracy(net, x_test, y_test, contexts[0]), time.perf_counter() - tic))
            state.epoch, state.batch = epoch + 1, 0
            state.commit()
    except kvstore_byteps.TrainingOver:
        pass                 # backup workers: the others finished the job's training
    # async and backup workers: every worker reads the servers' final weights (sync: no-op)
    kvstore_byteps.finish_training(trainer)
    test_acc = accuracy(net, x_test, y_test, contexts[0])
    checksum = check_identical(kv, net, metrics_key + 1, None if on_store else metrics_key)
    say(kv, "parameters identical on %s (sum |w| = %.4f)"
        % ("all %d workers" % kv.num_workers if kv.num_workers > 1 else "the one worker",
           checksum))
    if args.save_params and kv.rank == 0:
        net.save_parameters(args.save_params)
    say(kv, "final test accuracy %.4f after %s in %.1f s"
        % (test_acc, count(args.epochs, "epoch"), time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
