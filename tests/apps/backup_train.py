"""Synchronous training with backup workers (BYTEPS_BACKUP_WORKERS), with answers that are exact.

    backup_train.py {kv,gluon,module} STEPS SLOW_RANK [uncaught]

Every worker sleeps a random 0-20 ms before each step (seeded by its rank; ``SLOW_RANK``
sleeps 60 ms more), so which workers make each round differs from round to round.

* ``kv``: the store's API with plain SGD (learning rate 1) on one float64 vector of
  ``workers x STEPS`` entries: worker r's gradient at step s is 1 at entry ``r * STEPS + s``
  and 0 elsewhere, so the servers' final weights say which pushes were counted, and with
  which scale: ``-W / c`` where c pushes made the round, 0 for a dropped push. Checked: every
  entry is 0 or ``-W / c`` with c in [W - b, ..., W] (c > W - b when late pushes joined the
  round; never fewer than W - b, not even when the others wait in their final barrier: issue
  62), the entries sum to ``-W`` times a whole number of rounds, and the pushes counted in
  rounds of exactly W - b are a multiple of W - b.
* ``gluon`` / ``module``: gluon.Trainer and Module.fit on a least-squares problem; the
  workers end with the same weights (a zero-gradient round after a barrier reads the final
  ones) and the loss went down.

Every path ends with a barrier and a pull of the final weights (as MXNet scripts with
``update_on_kvstore`` do). The slow worker's training ends when the others wait in that barrier
(``kvstore_byteps.TrainingOver``): caught around the loop, as the docs say to; with
``uncaught``, it ends that worker's process (status 0) and the others still finish.

Prints ``BACKUP_RESULT <path> <rank> <digest>``; exit 3 on a wrong answer.
"""
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_byteps

EXIT_WRONG = 3
CATCH = "uncaught" not in sys.argv[4:]


class training:
    """``with training():`` around a training loop: TrainingOver ends it (where caught)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        return CATCH and kind is not None and issubclass(kind, kvstore_byteps.TrainingOver)


def pace(rank, slow_rank, rng):
    time.sleep(rng.uniform(0, 0.02) + (0.06 if rank == slow_rank else 0.0))


def final_weights(kv, key, weight):
    """The servers' final weights: after a barrier (every worker is done), a pull without a
    push reads the weights as they are."""
    kv._barrier()
    kv.pull(key, out=weight)
    return weight.asnumpy()


def run_kv(kv, steps, slow_rank, rng):
    workers, rank = kv.num_workers, kv.rank
    w = mx.nd.zeros((workers * steps,), dtype="float64")
    kv.init(0, w)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0, rescale_grad=1.0, wd=0.0))
    with training():
        for step in range(steps):
            pace(rank, slow_rank, rng)
            grad = np.zeros(workers * steps)
            grad[rank * steps + step] = 1.0
            kv.pushpull(0, mx.nd.array(grad, dtype="float64"), out=w)
            w.wait_to_read()
    final = -final_weights(kv, 0, w)
    return final


def check_kv(final, workers, backup, steps):
    counted = final[final != 0]
    allowed = {workers / c for c in range(workers - backup, workers + 1)}
    bad = [v for v in counted if not any(abs(v - a) < 1e-12 for a in allowed)]
    rounds = final.sum() / workers
    problems = []
    if bad:
        problems.append("entries %s are no share W/c of a round" % bad[:5])
    if abs(rounds - round(rounds)) > 1e-9:
        problems.append("the weights hold %.3f rounds, not a whole number" % rounds)
    full = np.isclose(counted, workers / (workers - backup)).sum()
    if full % (workers - backup):
        problems.append("%d pushes counted in full rounds, not a multiple of %d"
                        % (full, workers - backup))
    if len(counted) == 0:
        problems.append("%d of %d pushes counted" % (len(counted), workers * steps))
    return problems, "rounds=%d counted=%d dropped=%d" % (
        round(rounds), len(counted), workers * steps - len(counted))


def least_squares(rank, batch=16):
    rng = np.random.RandomState(100 + rank)
    x = rng.normal(size=(batch, 4)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")


def run_gluon(kv, steps, slow_rank, rng):
    net = gluon.nn.Dense(1, in_units=4)
    net.initialize(mx.init.Constant(0.0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore=kv)
    x, y = map(mx.nd.array, least_squares(kv.rank))
    losses = []
    with training():
        for _ in range(steps):
            pace(kv.rank, slow_rank, rng)
            with autograd.record():
                loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            trainer.step(1)
            losses.append(float(loss.asscalar()))
    assert trainer._update_on_kvstore, "gluon did not update on the store"
    # the store's keys are the indices of the trainer's parameter list
    return [final_weights(kv, i, p.data()) for i, p in enumerate(trainer._params)], losses


def run_module(kv, steps, slow_rank, rng):
    x, y = least_squares(kv.rank)
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=1, name="fc"),
                                        name="lro")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
    train = mx.io.NDArrayIter(x, y, batch_size=len(x), label_name="lro_label")
    losses = []

    def paced(param):
        pace(kv.rank, slow_rank, rng)
        losses.append(float(((mod.get_outputs()[0].asnumpy() - y) ** 2).mean()))
    with training():
        mod.fit(train, num_epoch=steps, kvstore=kv, optimizer="sgd",
                optimizer_params={"learning_rate": 0.05}, initializer=mx.init.Zero(),
                batch_end_callback=paced)
    args, _ = mod.get_params()
    names = sorted(args)
    weights = [final_weights(kv, n, args[n].copy()) for n in names]
    return weights, losses


def main():
    path, steps, slow_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kv = mx.kv.create("dist_byteps")
    assert kv.is_capable("optimizer") and kv.type == "dist_sync_byteps", kv.type
    rng = np.random.RandomState(kv.rank)
    if path == "kv":
        final = run_kv(kv, steps, slow_rank, rng)
        backup = int(__import__("os").environ["BYTEPS_BACKUP_WORKERS"])
        problems, digest = check_kv(final, kv.num_workers, backup, steps)
        digest += " " + ",".join("%g" % v for v in final)
    else:
        weights, losses = (run_gluon if path == "gluon" else run_module)(kv, steps, slow_rank,
                                                                        rng)
        # (a worker whose training ended early may have too few steps to show it)
        problems = [] if len(losses) < steps // 2 or losses[-1] < 0.5 * losses[0] else [
            "loss %s -> %s" % (losses[0], losses[-1])]
        digest = ",".join("%.6f" % v for w in weights for v in w.ravel())
    print("BACKUP_RESULT %s %d %s" % (path, kv.rank, digest), flush=True)
    if problems:
        print("WRONG: " + "; ".join(problems), flush=True)
        sys.exit(EXIT_WRONG)


if __name__ == "__main__":
    main()
