"""The end of training where the servers keep the weights (asynchronous, backup workers).

    FINAL_WEIGHTS_ROLE=r final_weights.py {gluon,module} STEPS SLOW_ROLE {all,skip-0,uncaught}

A natural script: every worker trains the same STEPS steps of a least-squares problem on its own
data (gluon.Trainer given ``kvstore='dist_byteps'`` as a string, or Module.fit with it), each
step paced by a random 0-10 ms sleep (the worker started as ``SLOW_ROLE``: 60 ms more), then
calls ``kvstore_byteps.finish_training`` and prints ``FINAL_RESULT <path> role <role> ended
<0|1> <digest>`` (``ended``: 1 if ``TrainingOver`` ended its training, which it caught).

* ``all``: every worker calls finish_training;
* ``skip-0``: role 0 does not (its store warns as it closes);
* ``uncaught``: ``SLOW_ROLE`` does not catch ``TrainingOver`` (backup workers): its process
  ends there with exit status 0 and prints nothing more.
"""
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import kvstore_byteps


def least_squares(seed, batch=16):
    rng = np.random.RandomState(100 + seed)
    x = rng.normal(size=(batch, 4)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")


def pace(slow, rng):
    time.sleep(rng.uniform(0, 0.01) + (0.06 if slow else 0.0))


def run_gluon(steps, slow, rng, seed, catch):
    net = gluon.nn.Dense(1, in_units=4)
    net.initialize(mx.init.Constant(0.0))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                            kvstore="dist_byteps")
    x, y = map(mx.nd.array, least_squares(seed))

    def train():
        for _ in range(steps):
            pace(slow, rng)
            with autograd.record():
                loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            trainer.step(1)
    ended = trained(train, catch)
    return trainer, trainer._kvstore, ended, lambda: [p.data() for p in trainer._params]


def run_module(steps, slow, rng, seed, catch):
    x, y = least_squares(seed)
    data = mx.sym.Variable("data")
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(data, num_hidden=1, name="fc"),
                                        name="lro")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["lro_label"])
    train_iter = mx.io.NDArrayIter(x, y, batch_size=len(x), label_name="lro_label")
    ended = trained(lambda: mod.fit(
        train_iter, num_epoch=steps, kvstore="dist_byteps", optimizer="sgd",
        optimizer_params={"learning_rate": 0.05}, initializer=mx.init.Zero(),
        batch_end_callback=lambda param: pace(slow, rng)), catch)

    def weights():
        args, _ = mod.get_params()
        return [args[n] for n in sorted(args)]
    return mod, mod._kvstore, ended, weights


def trained(train, catch) -> bool:
    """Run ``train``; True if TrainingOver ended it (re-raised unless ``catch``)."""
    try:
        train()
    except kvstore_byteps.TrainingOver:
        if not catch:
            raise
        return True
    return False


def main():
    path, steps, slow_role, variant = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4]
    # the scheduler numbers workers as they come: the test names each process's role instead
    role = int(os.environ["FINAL_WEIGHTS_ROLE"])
    rng = np.random.RandomState(role)
    run = run_gluon if path == "gluon" else run_module
    owner, kv, ended, weights = run(steps, role == slow_role, rng, role,
                                    catch=not (variant == "uncaught" and role == slow_role))
    if not (variant == "skip-0" and role == 0):
        kvstore_byteps.finish_training(owner)
    digest = ",".join("%.6f" % v for w in weights() for v in w.asnumpy().ravel())
    print("FINAL_RESULT %s role %d ended %d %s" % (path, role, ended, digest), flush=True)


if __name__ == "__main__":
    main()
